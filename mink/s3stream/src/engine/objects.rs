//! Writing objects: prepared object ids and PUTs (retried with the same bytes, hedged when slow).

use super::*;

impl Engine {
    /// A prepared object id that stays valid for at least a quarter of `prepare_ttl`, and when
    /// it expires (ms, by the engine's clock).
    pub(crate) async fn prepared_id(&self) -> Result<(u64, u64), StreamError> {
        let mut ids = self.ids.lock().await;
        let ttl_ms = u64::try_from(self.config.prepare_ttl.as_millis()).unwrap_or(u64::MAX);
        let margin = ttl_ms / 4;
        loop {
            let now = self.config.clock.now_ms();
            // An id too close to its expiry is let lapse unused.
            while let Some((id, expires)) = ids.pop_front() {
                if expires > now + margin {
                    return Ok((id, expires));
                }
            }
            let node = self.sink.node();
            let count = self.config.prepare_batch.max(1);
            let expires = now.saturating_add(ttl_ms);
            let proposed = self
                .sink
                .propose(Command::PrepareObject(PrepareObject {
                    node_id: node.node_id,
                    node_epoch: node.node_epoch,
                    count,
                    expires_at_ms: expires,
                }))
                .await?;
            match proposed.result {
                Ok(outcome) => match outcome.into_reply() {
                    Reply::Range(r) => ids.extend((r.start..r.end).map(|id| (id, expires))),
                    other => {
                        return Err(StreamError::Failed(format!("unexpected reply {other:?}")));
                    }
                },
                Err(r) => return Err(StreamError::Failed(format!("PrepareObject refused: {r}"))),
            }
        }
    }

    /// Writes a new object: takes a prepared id and PUTs `bytes` at its path (see
    /// [`Engine::put`]). Returns the id, for the commit that makes the object live, and when
    /// the id expires (ms).
    pub(crate) async fn put_new_object(&self, bytes: &Bytes) -> Result<(u64, u64), StreamError> {
        let (object_id, expires) = self.prepared_id().await?;
        self.put(&object_path(&self.config.object_prefix, object_id), bytes)
            .await?;
        Ok((object_id, expires))
    }

    /// PUTs `bytes` at `path`, retrying the same bytes until it succeeds (hedging a slow PUT
    /// when configured). Gives up only when the engine stops.
    pub(crate) async fn put(&self, path: &Path, bytes: &Bytes) -> Result<(), StreamError> {
        let mut backoff = Duration::from_millis(10);
        loop {
            if let Some(e) = self.failed.lock().expect("failed lock").clone() {
                return Err(e);
            }
            add(&self.stats.puts, 1);
            let attempt = self.store.put(path, PutPayload::from_bytes(bytes.clone()));
            let result = match self.config.hedge_after {
                None => attempt.await,
                Some(after) => {
                    tokio::pin!(attempt);
                    tokio::select! {
                        r = &mut attempt => r,
                        _ = tokio::time::sleep(after) => {
                            add(&self.stats.hedged_puts, 1);
                            let hedge = self.store.put(path, PutPayload::from_bytes(bytes.clone()));
                            tokio::select! {
                                r = &mut attempt => r,
                                r = hedge => r,
                            }
                        }
                    }
                }
            };
            match result {
                Ok(_) => return Ok(()),
                // Retrying cannot fix credentials or permissions.
                Err(
                    e @ (object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. }),
                ) => return Err(StreamError::Storage(e.to_string())),
                Err(e) => {
                    add(&self.stats.put_retries, 1);
                    tracing::warn!(%path, error = %e, "PUT failed; retrying with the same bytes");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
            }
        }
    }
}
