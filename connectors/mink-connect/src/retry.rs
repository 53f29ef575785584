//! Which failures a running connector outlasts, and how it waits between attempts.
//!
//! A Mink node that restarts (or is unreachable for a while) and Kafka brokers that are all
//! down are transient (as is a node answering `FAILED`, which one shutting down does): the connector logs, waits (100 ms doubling to 5 s, reset by a success)
//! and tries again, for as long as it takes, from where it was. Anything else (a refusal, a
//! record that is not a row, a fenced writer) ends the process, naming the error.

use std::time::Duration;

use mink_client::{ClientError, ErrorCode};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::time::Instant;

const FIRST_WAIT: Duration = Duration::from_millis(100);
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// A failure of the connector's own that is worth retrying (a seek librdkafka did not finish).
#[derive(Debug)]
pub(crate) struct Transient(pub(crate) String);

impl std::fmt::Display for Transient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Transient {}

/// Whether `e` (or what caused it) is a failure worth retrying.
pub(crate) fn transient(e: &anyhow::Error) -> bool {
    e.chain()
        .find_map(|c| {
            if c.is::<Transient>() {
                return Some(true);
            }
            if let Some(c) = c.downcast_ref::<ClientError>() {
                // A node that cannot serve (`FAILED`: one shutting down answers so) is
                // restarted, or another answers: waited for too.
                return Some(c.is_retriable() || c.code() == Some(ErrorCode::Failed));
            }
            c.downcast_ref::<KafkaError>().map(kafka_transient)
        })
        .unwrap_or(false)
}

/// Kafka errors that librdkafka recovers from by itself (it reconnects, finds the new leader or
/// coordinator): the connector reports them and goes on.
pub(crate) fn kafka_transient(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::AllBrokersDown
                | C::BrokerTransportFailure
                | C::Resolve
                | C::OperationTimedOut
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::RequestTimedOut
                | C::BrokerNotAvailable
                | C::NetworkException
                | C::CoordinatorLoadInProgress
                | C::CoordinatorNotAvailable
                | C::NotCoordinator
                | C::NotEnoughReplicas
                | C::KafkaStorageError
        )
    )
}

/// Waits between attempts of one thing that keeps failing.
#[derive(Debug)]
pub(crate) struct Backoff {
    what: String,
    failing_since: Option<Instant>,
    attempts: u64,
    wait: Duration,
}

impl Backoff {
    /// Retries of `what` (named in the log).
    pub(crate) fn new(what: impl Into<String>) -> Self {
        Backoff {
            what: what.into(),
            failing_since: None,
            attempts: 0,
            wait: FIRST_WAIT,
        }
    }

    /// An attempt succeeded: the next failure waits the shortest time again.
    pub(crate) fn succeeded(&mut self) {
        if let Some(since) = self.failing_since.take() {
            tracing::info!(
                what = %self.what,
                after_s = since.elapsed().as_secs_f64(),
                attempts = self.attempts,
                "working again"
            );
        }
        self.attempts = 0;
        self.wait = FIRST_WAIT;
    }

    /// An attempt failed with `e`: a transient error is logged and waited out (the caller
    /// tries again), any other is returned.
    pub(crate) async fn failed(&mut self, e: anyhow::Error) -> anyhow::Result<()> {
        if !transient(&e) {
            return Err(e);
        }
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        self.attempts += 1;
        tracing::warn!(
            what = %self.what,
            failing_for_s = since.elapsed().as_secs_f64(),
            attempt = self.attempts,
            retry_in_s = self.wait.as_secs_f64(),
            error = format!("{e:#}"),
            "retrying"
        );
        tokio::time::sleep(self.wait).await;
        self.wait = (self.wait * 2).min(LONGEST_WAIT);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;

    use super::*;

    #[test]
    fn what_is_transient() {
        let unreachable = ClientError::Transport {
            address: "n:1".into(),
            message: "tcp connect error".into(),
        };
        assert!(transient(
            &anyhow::Error::from(unreachable).context("reading the sink state")
        ));
        let down = KafkaError::MessageConsumption(RDKafkaErrorCode::AllBrokersDown);
        assert!(transient(
            &Err::<(), _>(down).context("consuming").unwrap_err()
        ));
        let stopping = ClientError::Server {
            code: ErrorCode::Failed,
            message: "metadata sink is shut down".into(),
            leader: None,
        };
        assert!(transient(&stopping.into()));
        let refused = ClientError::Server {
            code: ErrorCode::Invalid,
            message: "no".into(),
            leader: None,
        };
        assert!(!transient(&refused.into()));
        assert!(!transient(&anyhow::anyhow!("a record that is not a row")));
        let fenced = KafkaError::MessageConsumption(RDKafkaErrorCode::Fenced);
        assert!(!transient(&fenced.into()));
    }

    #[tokio::test(start_paused = true)]
    async fn waits_double_up_to_a_bound_and_reset() {
        let mut b = Backoff::new("a test");
        let unreachable = || {
            anyhow::Error::from(ClientError::Transport {
                address: "n:1".into(),
                message: "refused".into(),
            })
        };
        let mut waits = Vec::new();
        for _ in 0..8 {
            let before = Instant::now();
            b.failed(unreachable()).await.unwrap();
            waits.push(before.elapsed().as_millis());
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.succeeded();
        let before = Instant::now();
        b.failed(unreachable()).await.unwrap();
        assert_eq!(before.elapsed().as_millis(), 100);
        assert!(b.failed(anyhow::anyhow!("refused for good")).await.is_err());
    }
}
