//! One client connection: size-prefixed frames in, responses out in request order.

use std::sync::Arc;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use futures::future::BoxFuture;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable as _, Encodable};
use mink_node::Node;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

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
    /// `body` framed as the response to this request (header version by its API and version).
    pub(crate) fn respond(&self, body: &impl Encodable) -> Option<Frames> {
        respond(self.api_key, &self.header, body).map(Frames::from)
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
    let (answers, mut pending) = tokio::sync::mpsc::channel::<Answer>(IN_FLIGHT);
    let writing = tokio::spawn(async move {
        while let Some(answer) = pending.recv().await {
            let frames = match answer {
                Answer::Now(f) => f,
                Answer::Later(f) => f.await,
            };
            if let Some(mut f) = frames {
                writer.write_all_buf(&mut f).await?;
            }
        }
        writer.shutdown().await
    });
    let result = async {
        loop {
            let size = match reader.read_i32().await {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            let size_ok = usize::try_from(size)
                .ok()
                .filter(|s| (8..=config.max_request_bytes).contains(s));
            let Some(size) = size_ok else {
                return Err(ConnError::FrameSize(size.into(), config.max_request_bytes));
            };
            let mut frame = BytesMut::zeroed(size);
            reader.read_exact(&mut frame).await?;
            let answer = handle(&node, &config, &groups, &peer, frame.freeze()).await?;
            if answers.send(answer).await.is_err() {
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

/// Decodes one request frame and answers it.
async fn handle(
    node: &Node,
    config: &Arc<KafkaConfig>,
    groups: &Arc<crate::groups::Groups>,
    peer: &str,
    mut frame: Bytes,
) -> Result<Answer, ConnError> {
    let api_key = ApiKey::try_from(frame.clone().get_i16())
        .map_err(|()| ConnError::Malformed("an unknown API key".into()))?;
    let version = frame.clone().split_off(2).get_i16();
    if api_key == ApiKey::ApiVersions && !crate::api::supported(api_key, version) {
        // A client newer than us: answered in version 0, so it can read the error and retry
        // with a version it finds in our list.
        let header = RequestHeader::decode(&mut frame, 1)
            .map_err(|e| ConnError::Malformed(e.to_string()))?;
        let answer = crate::api::api_versions_unsupported(&header).map(Frames::from);
        return Ok(Answer::Now(answer));
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
    crate::api::handle(cx, frame)
        .await
        .map_err(|e| ConnError::Malformed(format!("{api_key:?} v{version}: {e}")))
}
