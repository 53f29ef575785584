//! One client connection: size-prefixed frames in, responses out in request order.

use std::sync::Arc;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use futures::future::BoxFuture;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable as _, Encodable};
use mink_node::Node;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::KafkaConfig;
use crate::frames::Frames;

/// Responses computed but not yet written, at most: a client pipelining more waits.
const IN_FLIGHT: usize = 64;

/// Why a connection was closed (what Kafka brokers do with a request they cannot parse).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a request frame of {0} bytes (the limit is {1})")]
    FrameSize(i64, usize),
    #[error("request: {0}")]
    Malformed(String),
    #[error("idle for {0:?} (connections_max_idle)")]
    Idle(std::time::Duration),
}

/// A request's answer: its frame now or once `Later` resolves; `None` sends nothing (a
/// produce request with acks = 0).
pub(crate) enum Answer {
    Now(Option<Frames>),
    Later(BoxFuture<'static, Option<Frames>>),
}

/// What a handler knows of the request it answers.
pub(crate) struct Context {
    pub(crate) node: Node,
    pub(crate) config: Arc<KafkaConfig>,
    pub(crate) groups: Arc<crate::groups::Groups>,
    /// The client's address (DescribeGroups names it).
    pub(crate) peer: String,
    pub(crate) header: RequestHeader,
    pub(crate) api_key: ApiKey,
}

impl Context {
    /// `body` framed as the response to this request (header version by its API and version);
    /// see [`Frames::answer`].
    pub(crate) fn respond(&self, body: &impl Encodable) -> Option<Frames> {
        Frames::answer(respond(self.api_key, &self.header, body))
    }
}

/// `body` framed as the response to `header`: size, response header, body.
pub(crate) fn respond(
    api_key: ApiKey,
    header: &RequestHeader,
    body: &impl Encodable,
) -> Option<Bytes> {
    let version = header.request_api_version;
    // Sized up front: a fetch response carries megabytes of records, and growing the buffer
    // would copy them again.
    let mut buf = BytesMut::with_capacity(64 + body.compute_size(version).unwrap_or(0));
    buf.put_i32(0);
    let response_header = ResponseHeader::default().with_correlation_id(header.correlation_id);
    let encoded = response_header
        .encode(&mut buf, api_key.response_header_version(version))
        .and_then(|()| body.encode(&mut buf, version));
    if let Err(e) = encoded {
        // Our own response not encoding is a bug: drop the connection rather than answer wrong.
        tracing::error!(error = %e, ?api_key, version, "encoding a Kafka response failed");
        return None;
    }
    let size = i32::try_from(buf.len() - 4).unwrap_or(i32::MAX);
    buf[..4].copy_from_slice(&size.to_be_bytes());
    Some(buf.freeze())
}

pub(crate) async fn run(
    node: Node,
    config: Arc<KafkaConfig>,
    groups: Arc<crate::groups::Groups>,
    socket: tokio::net::TcpStream,
) -> Result<(), ConnError> {
    let peer = socket
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    let (mut reader, mut writer) = socket.into_split();
    let (answers, mut pending) =
        tokio::sync::mpsc::channel::<(Answer, Option<OwnedSemaphorePermit>, Asked)>(IN_FLIGHT);
    // Bytes of answers not yet written: a client that stops reading stops being read.
    let budget = config.max_unsent_bytes.clamp(1, MAX_BUDGET);
    let unsent = Arc::new(Semaphore::new(budget));
    let activity = Arc::new(Activity::default());
    let writing = tokio::spawn({
        let (unsent, activity, idle) = (
            Arc::clone(&unsent),
            Arc::clone(&activity),
            config.connections_max_idle,
        );
        async move {
            let written = async {
                while let Some((answer, permit, (api, started))) = pending.recv().await {
                    let frames = match answer {
                        Answer::Now(f) => f,
                        Answer::Later(f) => f.await,
                    };
                    let size = frames.as_ref().map_or(0, |f| f.remaining());
                    if let Some(mut f) = frames {
                        if !f.has_remaining() {
                            // An answer that failed to encode: a client waiting for it
                            // would wait out its request timeout; closing makes it retry.
                            return Err(std::io::Error::other("an answer failed to encode"));
                        }
                        tokio::time::timeout(idle, writer.write_all_buf(&mut f))
                            .await
                            .map_err(|_| {
                                std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    "the client read no answer for connections_max_idle",
                                )
                            })??;
                    }
                    drop(permit);
                    crate::metrics::answered(api, started, size);
                    activity.answered();
                }
                writer.shutdown().await
            }
            .await;
            // The reader may wait for room the writer will never make.
            unsent.close();
            written
        }
    });
    let result = async {
        loop {
            let frame = tokio::select! {
                frame = read_idle(&mut reader, &config, &activity) => frame?,
                // The writer stopped (the client read nothing for too long, or went away).
                () = answers.closed() => None,
            };
            let Some(frame) = frame else {
                return Ok::<(), ConnError>(()); // the client closed between requests
            };
            let (started, size) = (std::time::Instant::now(), frame.len() + 4);
            let (api_key, answer) = handle(&node, &config, &groups, &peer, frame).await?;
            let asked = (crate::metrics::requested(api_key, size), started);
            let permit = match &answer {
                Answer::Now(Some(f)) => {
                    let n = u32::try_from(f.remaining().min(budget)).unwrap_or(u32::MAX);
                    match Arc::clone(&unsent).acquire_many_owned(n).await {
                        Ok(p) => Some(p),
                        Err(_) => return Ok(()), // the writer stopped: the client went away
                    }
                }
                _ => None,
            };
            activity.asked();
            if answers.send((answer, permit, asked)).await.is_err() {
                return Ok(()); // the writer stopped: the client went away
            }
        }
    }
    .await;
    drop(answers);
    let written = writing.await;
    result?;
    match written {
        Ok(r) => r.map_err(ConnError::Io),
        Err(e) => Err(ConnError::Malformed(e.to_string())),
    }
}

/// The largest budget of unsent bytes (a semaphore's permits are taken as a `u32`).
const MAX_BUDGET: usize = 1 << 31;

/// Frames up to this size are read into a buffer sized at once; a larger one grows as its
/// bytes arrive, so that a size on the wire alone allocates little.
const PREALLOCATED: usize = 1 << 20;

/// What a connection is doing for its client: answers queued or being computed, and when it
/// last answered (what [`read_idle`] measures idleness from).
#[derive(Default)]
struct Activity {
    pending: std::sync::atomic::AtomicUsize,
    /// Answers written so far: a change restarts the idle clock.
    answered: std::sync::atomic::AtomicU64,
}

impl Activity {
    fn asked(&self) {
        self.pending
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn answered(&self) {
        self.pending
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.answered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn busy(&self) -> bool {
        self.pending.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    fn answers(&self) -> u64 {
        self.answered.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The next request frame, `None` when the client closed the connection between frames; an
/// error when the connection was idle for `connections_max_idle` meanwhile (nothing pending,
/// nothing answered, the frame not whole).
async fn read_idle(
    reader: &mut tokio::net::tcp::OwnedReadHalf,
    config: &KafkaConfig,
    activity: &Activity,
) -> Result<Option<Bytes>, ConnError> {
    let idle = config.connections_max_idle;
    let read = read_frame(reader, config.max_request_bytes);
    tokio::pin!(read);
    let mut answers = activity.answers();
    loop {
        tokio::select! {
            frame = &mut read => return frame,
            () = tokio::time::sleep(idle) => {
                let now = activity.answers();
                if !activity.busy() && now == answers {
                    return Err(ConnError::Idle(idle));
                }
                answers = now;
            }
        }
    }
}

/// One size-prefixed frame (its bytes after the size), `None` at a clean end of stream.
async fn read_frame(
    reader: &mut tokio::net::tcp::OwnedReadHalf,
    max_request_bytes: usize,
) -> Result<Option<Bytes>, ConnError> {
    let size = match reader.read_i32().await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let size_ok = usize::try_from(size)
        .ok()
        .filter(|s| (8..=max_request_bytes).contains(s));
    let Some(size) = size_ok else {
        return Err(ConnError::FrameSize(size.into(), max_request_bytes));
    };
    let mut frame = BytesMut::with_capacity(size.min(PREALLOCATED));
    while frame.len() < size {
        if frame.len() == frame.capacity() {
            // Doubling: a large frame is copied at most once over in all.
            frame.reserve((size - frame.len()).min(frame.len()));
        }
        let rest = (size - frame.len()) as u64;
        if (&mut *reader).take(rest).read_buf(&mut frame).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok(Some(frame.freeze()))
}

/// A request's API (as its metrics label) and when its frame was read: what its answer is
/// measured against.
type Asked = (opentelemetry::KeyValue, std::time::Instant);

/// Decodes one request frame and answers it; with the API it named.
async fn handle(
    node: &Node,
    config: &Arc<KafkaConfig>,
    groups: &Arc<crate::groups::Groups>,
    peer: &str,
    mut frame: Bytes,
) -> Result<(ApiKey, Answer), ConnError> {
    let api_key = ApiKey::try_from(frame.clone().get_i16())
        .map_err(|()| ConnError::Malformed("an unknown API key".into()))?;
    let version = frame.clone().split_off(2).get_i16();
    if api_key == ApiKey::ApiVersions && !crate::api::supported(api_key, version) {
        // A client newer than us: answered in version 0, so it can read the error and retry
        // with a version it finds in our list.
        let header = RequestHeader::decode(&mut frame, 1)
            .map_err(|e| ConnError::Malformed(e.to_string()))?;
        let answer = Frames::answer(crate::api::api_versions_unsupported(&header));
        return Ok((api_key, Answer::Now(answer)));
    }
    if !crate::api::supported(api_key, version) {
        return Err(ConnError::Malformed(format!(
            "{api_key:?} version {version} is not supported"
        )));
    }
    let header = RequestHeader::decode(&mut frame, api_key.request_header_version(version))
        .map_err(|e| ConnError::Malformed(e.to_string()))?;
    let cx = Context {
        node: node.clone(),
        config: Arc::clone(config),
        groups: Arc::clone(groups),
        peer: peer.to_string(),
        header,
        api_key,
    };
    let answer = crate::api::handle(cx, frame)
        .await
        .map_err(|e| ConnError::Malformed(format!("{api_key:?} v{version}: {e}")))?;
    Ok((api_key, answer))
}
