//! The KV commands: put, put if absent, delete, delete if matches.

use super::*;

impl State {
    pub(super) fn kv_reply(&self, key: &str) -> KvReply {
        match self.kv.get(key) {
            Some(r) => KvReply {
                previous: Some(r.value.clone()),
                version: r.version,
            },
            None => KvReply::default(),
        }
    }

    pub(super) fn put_kv(&mut self, ctx: &ApplyContext, c: &PutKv) -> CommandResult {
        let previous = self.kv_reply(&c.key);
        if previous.previous.as_ref() == Some(&c.value) {
            return redundant(Reply::Kv(previous));
        }
        self.kv.insert(
            c.key.clone(),
            KvRecord {
                key: c.key.clone(),
                value: c.value.clone(),
                version: ctx.index,
            },
        );
        done(Reply::Kv(KvReply {
            previous: previous.previous,
            version: ctx.index,
        }))
    }

    pub(super) fn put_kv_if_absent(
        &mut self,
        ctx: &ApplyContext,
        c: &PutKvIfAbsent,
    ) -> CommandResult {
        if let Some(existing) = self.kv.get(&c.key) {
            if existing.value == c.value {
                return redundant(Reply::Kv(self.kv_reply(&c.key)));
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!("key {:?} already holds another value", c.key),
            )
            .with_current(existing.version)
            .with_value(Some(existing.value.clone())));
        }
        self.kv.insert(
            c.key.clone(),
            KvRecord {
                key: c.key.clone(),
                value: c.value.clone(),
                version: ctx.index,
            },
        );
        done(Reply::Kv(KvReply {
            previous: None,
            version: ctx.index,
        }))
    }

    pub(super) fn delete_kv(&mut self, c: &DeleteKv) -> CommandResult {
        match self.kv.remove(&c.key) {
            None => redundant(Reply::Kv(KvReply::default())),
            Some(r) => done(Reply::Kv(KvReply {
                previous: Some(r.value),
                version: 0,
            })),
        }
    }

    pub(super) fn delete_kv_if_matches(&mut self, c: &DeleteKvIfMatches) -> CommandResult {
        match self.kv.get(&c.key) {
            None => redundant(Reply::Kv(KvReply::default())),
            Some(r) if r.value != c.expected => Err(rej(
                RejectionKind::Conflict,
                format!("key {:?} holds another value", c.key),
            )
            .with_current(r.version)
            .with_value(Some(r.value.clone()))),
            Some(_) => {
                let r = self.kv.remove(&c.key).expect("checked above");
                done(Reply::Kv(KvReply {
                    previous: Some(r.value),
                    version: 0,
                }))
            }
        }
    }
}
