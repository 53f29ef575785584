//! Bounded caches for the read path: recent committed appends (the log cache), decoded object
//! indexes, and fetched data blocks. All are bounded in bytes and evict least recently used
//! (the log cache: oldest inserted), entries loaded ahead of their use after the others.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::format::{BlockIndex, RecordBatch};

/// Hit and miss counters of one cache.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Entries inserted ahead of their use and evicted before anyone read them: loads the
    /// cache had no room to keep, which their readers make again.
    pub evicted_unread: AtomicU64,
}

impl CacheStats {
    fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
}

/// Recently committed batches per stream, so that tailing readers never touch object storage.
#[derive(Debug)]
pub(crate) struct LogCache {
    inner: Mutex<LogCacheInner>,
    capacity: usize,
    pub(crate) stats: CacheStats,
}

#[derive(Debug, Default)]
struct LogCacheInner {
    streams: HashMap<u64, BTreeMap<u64, RecordBatch>>,
    /// Insertion order, for eviction.
    order: VecDeque<(u64, u64)>,
    bytes: usize,
}

impl LogCache {
    pub(crate) fn new(capacity: usize) -> Self {
        LogCache {
            inner: Mutex::new(LogCacheInner::default()),
            capacity,
            stats: CacheStats::default(),
        }
    }

    pub(crate) fn insert(&self, stream_id: u64, batch: RecordBatch) {
        let mut c = self.inner.lock().expect("log cache lock");
        c.bytes += batch.payload.len();
        c.order.push_back((stream_id, batch.base_offset));
        c.streams
            .entry(stream_id)
            .or_default()
            .insert(batch.base_offset, batch);
        while c.bytes > self.capacity {
            let Some((s, base)) = c.order.pop_front() else {
                break;
            };
            let mut freed = 0;
            if let Some(batches) = c.streams.get_mut(&s) {
                if let Some(b) = batches.remove(&base) {
                    freed = b.payload.len();
                }
                if batches.is_empty() {
                    c.streams.remove(&s);
                }
            }
            c.bytes -= freed;
        }
    }

    /// Batches from the one containing `offset`, contiguous, below `end`, up to `max_bytes`
    /// (at least one). `None` unless the cache holds the batch containing `offset`.
    pub(crate) fn read(
        &self,
        stream_id: u64,
        offset: u64,
        end: u64,
        max_bytes: usize,
    ) -> Option<Vec<RecordBatch>> {
        let c = self.inner.lock().expect("log cache lock");
        let batches = c.streams.get(&stream_id);
        let first = batches.and_then(|b| {
            b.range(..=offset)
                .next_back()
                .filter(|(_, b)| b.end_offset() > offset)
        });
        let Some((&first_base, _)) = first else {
            self.stats.miss();
            return None;
        };
        self.stats.hit();
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut next = first_base;
        for (&base, batch) in batches.expect("found above").range(first_base..) {
            if base != next || base >= end || (bytes >= max_bytes && !out.is_empty()) {
                break;
            }
            bytes += batch.payload.len();
            next = batch.end_offset();
            out.push(batch.clone());
        }
        Some(out)
    }

    /// Drops everything below `offset` of a stream (trimmed).
    pub(crate) fn trim(&self, stream_id: u64, offset: u64) {
        let mut c = self.inner.lock().expect("log cache lock");
        let mut freed = 0;
        if let Some(batches) = c.streams.get_mut(&stream_id) {
            let keep = batches.split_off(&offset);
            freed = batches.values().map(|b| b.payload.len()).sum::<usize>();
            *batches = keep;
            if batches.is_empty() {
                c.streams.remove(&stream_id);
            }
        }
        c.bytes -= freed;
        // The eviction queue still names what was trimmed; rebuild it once that is most of it.
        let live: usize = c.streams.values().map(BTreeMap::len).sum();
        if c.order.len() > 2 * live + 1024 {
            let LogCacheInner { streams, order, .. } = &mut *c;
            order.retain(|(s, base)| streams.get(s).is_some_and(|b| b.contains_key(base)));
        }
    }
}

/// A small byte-bounded LRU map.
#[derive(Debug)]
pub(crate) struct Lru<K, V> {
    inner: Mutex<LruInner<K, V>>,
    capacity: usize,
    pub(crate) stats: CacheStats,
    /// Woken when unread entries are read or evicted ([`Lru::unread_freed`]).
    unread_freed: tokio::sync::Notify,
}

#[derive(Debug)]
struct LruInner<K, V> {
    map: HashMap<K, Entry<V>>,
    /// use tick -> key, of the entries read (or inserted for use now)
    recency: BTreeMap<u64, K>,
    /// use tick -> key, of the entries inserted ahead of use and not read since
    unread_recency: BTreeMap<u64, K>,
    tick: u64,
    bytes: usize,
    /// Bytes of entries inserted ahead of use ([`Lru::insert_unread`]) not read since.
    unread: usize,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    size: usize,
    used: u64,
    /// Inserted ahead of use and not read since.
    unread: bool,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Lru<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Lru {
            inner: Mutex::new(LruInner {
                map: HashMap::new(),
                recency: BTreeMap::new(),
                unread_recency: BTreeMap::new(),
                tick: 0,
                bytes: 0,
                unread: 0,
            }),
            capacity,
            stats: CacheStats::default(),
            unread_freed: tokio::sync::Notify::new(),
        }
    }

    /// Resolves once unread bytes have been freed (an unread entry read or evicted) after
    /// this call: for waiting until more fits beside them ([`Lru::unread_bytes`]).
    pub(crate) fn unread_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.unread_freed.notified()
    }

    pub(crate) fn get(&self, key: &K) -> Option<V> {
        self.lookup(key, true)
    }

    /// Marks `key` read and recent, as [`Lru::get`] does, without counting a lookup: for an
    /// entry whose reader got its value from the load that inserted it.
    pub(crate) fn mark_read(&self, key: &K) {
        self.lookup(key, false);
    }

    /// The value of `key` if cached, the entry left as it is (not counted, not made recent,
    /// still unread): for a load ahead of use checking what is cached already, which would
    /// otherwise hand its reader's unread entries over to eviction before they are read.
    pub(crate) fn peek(&self, key: &K) -> Option<V> {
        let c = self.inner.lock().expect("lru lock");
        c.map.get(key).map(|e| e.value.clone())
    }

    fn lookup(&self, key: &K, count: bool) -> Option<V> {
        let mut c = self.inner.lock().expect("lru lock");
        c.tick += 1;
        let tick = c.tick;
        let Some(entry) = c.map.get_mut(key) else {
            if count {
                self.stats.miss();
            }
            return None;
        };
        let old = std::mem::replace(&mut entry.used, tick);
        let value = entry.value.clone();
        let read = std::mem::take(&mut entry.unread).then_some(entry.size);
        c.unread -= read.unwrap_or(0);
        if read.is_some() {
            c.unread_recency.remove(&old);
        } else {
            c.recency.remove(&old);
        }
        c.recency.insert(tick, key.clone());
        drop(c);
        if count {
            self.stats.hit();
        }
        if read.is_some() {
            self.unread_freed.notify_waiters();
        }
        Some(value)
    }

    /// Whether `key` is cached (not counted as a hit or a miss, not made recent).
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.inner.lock().expect("lru lock").map.contains_key(key)
    }

    pub(crate) fn insert(&self, key: K, value: V, size: usize) {
        self.insert_as(key, value, size, false);
    }

    /// Inserts an entry loaded ahead of its use: it counts in [`Lru::unread_bytes`] until it
    /// is read or evicted, and while unread entries take at most half the capacity, the
    /// others are evicted before them (a reader's blocks loaded ahead outlast blocks read
    /// since, however recently).
    pub(crate) fn insert_unread(&self, key: K, value: V, size: usize) {
        self.insert_as(key, value, size, true);
    }

    /// Bytes of entries inserted with [`Lru::insert_unread`], cached and not read since: what
    /// readers have been given ahead of their reading, so that more is loaded ahead only while
    /// it fits beside them.
    pub(crate) fn unread_bytes(&self) -> usize {
        self.inner.lock().expect("lru lock").unread
    }

    fn insert_as(&self, key: K, value: V, size: usize, unread: bool) {
        let mut c = self.inner.lock().expect("lru lock");
        c.tick += 1;
        let tick = c.tick;
        let mut freed = false;
        if let Some(old) = c.map.remove(&key) {
            freed |= c.remove_accounting(&old);
        }
        c.map.insert(
            key.clone(),
            Entry {
                value,
                size,
                used: tick,
                unread,
            },
        );
        if unread {
            c.unread_recency.insert(tick, key);
            c.unread += size;
        } else {
            c.recency.insert(tick, key);
        }
        c.bytes += size;
        while c.bytes > self.capacity {
            // Unread entries go only past half the capacity, or when nothing else is left.
            let queue = if c.unread > self.capacity / 2 || c.recency.is_empty() {
                &mut c.unread_recency
            } else {
                &mut c.recency
            };
            let Some((_, victim)) = queue.pop_first() else {
                break;
            };
            if let Some(old) = c.map.remove(&victim)
                && c.remove_accounting(&old)
            {
                freed = true;
                self.stats.evicted_unread.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(c);
        if freed {
            self.unread_freed.notify_waiters();
        }
    }
}

impl<K, V> LruInner<K, V> {
    /// Takes `old` out of the counts and queues; whether it was unread (freeing unread bytes).
    fn remove_accounting(&mut self, old: &Entry<V>) -> bool {
        self.bytes -= old.size;
        if old.unread {
            self.unread_recency.remove(&old.used);
            self.unread -= old.size;
        } else {
            self.recency.remove(&old.used);
        }
        old.unread
    }
}

/// Decoded object indexes, keyed by object id.
pub(crate) type IndexCache = Lru<u64, std::sync::Arc<Vec<BlockIndex>>>;
/// Fetched data blocks, keyed by (object id, block position).
pub(crate) type BlockCache = Lru<(u64, u64), Bytes>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries inserted ahead of use count as unread until read or evicted, once each, and
    /// are evicted after the others while they take at most half the capacity.
    #[test]
    fn unread_bytes_count_until_read_or_evicted() {
        let lru: Lru<u32, u32> = Lru::new(100);
        lru.insert_unread(1, 1, 30);
        lru.insert_unread(2, 2, 30);
        lru.insert(3, 3, 30);
        assert_eq!(lru.unread_bytes(), 60);
        assert_eq!(lru.get(&1), Some(1));
        assert_eq!(lru.get(&1), Some(1));
        assert_eq!(lru.unread_bytes(), 30);
        // 2 is the least recently used, but unread (within half the capacity): 3 goes first.
        lru.insert(4, 4, 30);
        assert!(lru.contains(&2) && !lru.contains(&3));
        assert_eq!(lru.unread_bytes(), 30);
        // Past half the capacity, unread entries are evicted too, the oldest first.
        lru.insert_unread(5, 5, 30);
        assert!(!lru.contains(&2) && lru.contains(&1) && lru.contains(&4));
        assert_eq!(lru.unread_bytes(), 30);
        assert_eq!(lru.stats.evicted_unread.load(Ordering::Relaxed), 1);
        // Replacing an unread entry counts it once.
        lru.insert_unread(5, 5, 10);
        lru.insert_unread(5, 5, 20);
        assert_eq!(lru.unread_bytes(), 20);
        lru.insert(5, 5, 20);
        assert_eq!(lru.unread_bytes(), 0);
    }

    /// A peek leaves an unread entry unread and least recent; marking it read counts no
    /// lookup.
    #[test]
    fn peeks_leave_entries_unread_and_marks_count_no_lookup() {
        let lru: Lru<u32, u32> = Lru::new(100);
        lru.insert_unread(1, 1, 30);
        assert_eq!(lru.peek(&1), Some(1));
        assert_eq!(lru.peek(&2), None);
        assert_eq!(lru.unread_bytes(), 30);
        lru.mark_read(&1);
        assert_eq!(lru.unread_bytes(), 0);
        let (hits, misses) = (&lru.stats.hits, &lru.stats.misses);
        assert_eq!(
            (hits.load(Ordering::Relaxed), misses.load(Ordering::Relaxed)),
            (0, 0)
        );
    }
}
