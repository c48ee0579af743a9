//! The record of a claimed batch with recovery (`list/batch.lua`) through the typed calls the
//! readers use (`Claim`, `SettleList`, `Lease`): identical bytes in two batches, a resent claim,
//! a resent settle, a sweep before a settle, a lease of a batch, and a claim of the old form
//! (one member per entry, recorded before batches) still swept.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_redis::{Call, Claim, Dest, Lease, Op, Record, SettleKeys, SettleList};

use crate::{key, on_both};

/// A queue's keys under `prefix`.
struct Q {
    levels: Vec<String>,
    processing: String,
    zset: String,
    batches: String,
    settle: SettleKeys,
}

impl Q {
    fn new(prefix: &str) -> Self {
        let k = |s: &str| key(prefix, &format!("q{s}"));
        Self {
            levels: vec![k("")],
            processing: k(".processing"),
            zset: k(".claims"),
            batches: k(".claims.batches"),
            settle: SettleKeys {
                processing: k(".processing"),
                dead: k(".dead"),
                delayed: k(".delayed"),
                payloads: k(".delayed.payloads"),
                record: k(".claims"),
                cancels: k(".cancels"),
                batches: k(".claims.batches"),
            },
        }
    }

    fn record(&self, min_idle_ms: u64, most: u32) -> Record {
        Record::Claims {
            processing: self.processing.clone(),
            zset: self.zset.clone(),
            batches: self.batches.clone(),
            reader: "r1".to_owned(),
            min_idle_ms,
            ttl_ms: 0,
            most,
        }
    }

    /// Claims up to `max` entries (sweeping claims idle over `min_idle_ms` first): (recovered,
    /// the batch's id, values).
    async fn claim(
        &self,
        client: &Client,
        max: usize,
        seq: u64,
        min_idle_ms: u64,
    ) -> (u64, String, Vec<Bytes>) {
        self.claim_most(client, max, seq, min_idle_ms, 128).await
    }

    /// [`claim`](Self::claim), sweeping at most `most` entries.
    async fn claim_most(
        &self,
        client: &Client,
        max: usize,
        seq: u64,
        min_idle_ms: u64,
        most: u32,
    ) -> (u64, String, Vec<Bytes>) {
        let record = self.record(min_idle_ms, most);
        let got = Claim {
            levels: &self.levels,
            record: &record,
            gates: &[],
            max,
            first_seq: seq,
        }
        .call(client)
        .await
        .expect("the claim runs");
        let id = format!("r1:{seq}.{}", String::from_utf8_lossy(&got.run));
        (got.recovered, id, got.values)
    }

    /// Settles `(value, batch id, index, op)`: how many were still owned.
    async fn settle(&self, client: &Client, entries: &[(&[u8], &str, usize, Op)]) -> i64 {
        let dest = Dest::list(self.levels.clone());
        SettleList {
            keys: &self.settle,
            dest: &dest,
            token: None,
            entries: entries
                .iter()
                .map(|(v, id, i, op)| {
                    (
                        Bytes::copy_from_slice(v),
                        Some(Bytes::from(format!("{id}/{i}"))),
                        op.clone(),
                    )
                })
                .collect(),
        }
        .call(client)
        .await
        .expect("the settle runs")
        .owned
    }

    async fn sizes(&self, client: &Client) -> (i64, i64, i64, i64) {
        (
            client.llen(&self.levels[0]).await.unwrap(),
            client.llen(&self.processing).await.unwrap(),
            client.zcard(&self.zset).await.unwrap(),
            client.hlen(&self.batches).await.unwrap(),
        )
    }

    async fn clean(&self, client: &Client) {
        let mut keys = self.levels.clone();
        keys.extend([
            self.processing.clone(),
            self.zset.clone(),
            self.batches.clone(),
        ]);
        let _: i64 = client.del(keys).await.unwrap_or(0);
    }
}

const NEVER: u64 = 1_000_000_000_000;

/// Two batches both holding `v` (identical bytes), one holding `w` too. A settles `v` (a
/// retry, so it goes back once), then a sweep of A alone (B renewed) moves back only `w`: not
/// A's settled `v`, nor the copy of `v` that B holds. B's settle of `v` still finds it; a resent
/// settle finds nothing; every key is empty at the end. Returns what each step saw.
async fn identical(client: Client, prefix: String) -> Vec<i64> {
    let q = Q::new(&prefix);
    let mut out = Vec::new();
    let _: i64 = client
        .rpush(&q.levels[0], vec!["x", "w", "v"])
        .await
        .unwrap();
    let (_, a, got) = q.claim(&client, 2, 0, NEVER).await;
    assert_eq!(got, vec![Bytes::from("v"), Bytes::from("w")]);
    let _: i64 = client.lpush(&q.levels[0], "v").await.unwrap();
    // The queue is now [v, x] (x next): take x and v into batch B.
    let (_, b, got) = q.claim(&client, 2, 2, NEVER).await;
    assert_eq!(got, vec![Bytes::from("x"), Bytes::from("v")]);
    let (s, _, _, _) = q.sizes(&client).await;
    out.push(s);
    // A retries its v.
    let retry = Op::Retry {
        frame: Bytes::from("v2"),
    };
    out.push(q.settle(&client, &[(b"v", &a, 0, retry.clone())]).await);
    // Resent: nothing twice.
    out.push(q.settle(&client, &[(b"v", &a, 0, retry)]).await);
    // A goes stale; B is renewed.
    let _: i64 = client
        .zadd(&q.zset, None, None, false, false, vec![(1.0, a.as_str())])
        .await
        .unwrap();
    let (recovered, _, _) = q.claim(&client, 0, 4, 60_000).await;
    out.push(i64::try_from(recovered).unwrap());
    let queue: Vec<Bytes> = client.lrange(&q.levels[0], 0, -1).await.unwrap();
    out.push(i64::try_from(queue.len()).unwrap());
    // B still owns both of its entries: the v is found.
    out.push(
        q.settle(&client, &[(b"v", &b, 1, Op::Ack), (b"x", &b, 0, Op::Ack)])
            .await,
    );
    // A settle of A's w after the sweep: not owned, nothing written.
    out.push(q.settle(&client, &[(b"w", &a, 1, Op::Ack)]).await);
    let (_, p, z, h) = q.sizes(&client).await;
    out.extend([p, z, h]);
    q.clean(&client).await;
    out
}

#[tokio::test]
async fn a_sweep_moves_back_only_what_its_batch_holds_unsettled() {
    // queue left 0 after B; owned 1; resent 0; recovered 1 (w); queue v2 + w; B owns 2; A's w
    // after the sweep 0; processing, set and hash empty.
    on_both("batches", vec![0, 1, 0, 1, 2, 2, 0, 0, 0, 0], identical).await;
}

/// A claim resent after its reply was lost runs again under its own run: two batches, each
/// swept on its own; a lease renews a batch (and never adds a settled one back); a member of
/// the old form is swept as before. Returns what each step saw.
async fn resent(client: Client, prefix: String) -> Vec<i64> {
    let q = Q::new(&prefix);
    let mut out = Vec::new();
    let _: i64 = client.rpush(&q.levels[0], vec!["b", "a"]).await.unwrap();
    let (_, first, _) = q.claim(&client, 1, 0, NEVER).await;
    let (_, second, _) = q.claim(&client, 1, 0, NEVER).await;
    out.push(i64::from(first != second));
    let (_, _, z, h) = q.sizes(&client).await;
    out.extend([z, h]);
    // The first is settled; a lease of both moves the second only and adds nothing back.
    out.push(q.settle(&client, &[(b"a", &first, 0, Op::Ack)]).await);
    let _: i64 = client
        .zadd(
            &q.zset,
            None,
            None,
            false,
            false,
            vec![(1.0, second.as_str())],
        )
        .await
        .unwrap();
    let members = [Bytes::from(first.clone()), Bytes::from(second.clone())];
    let moved = Lease {
        zset: &q.zset,
        batches: &q.batches,
        ttl_ms: 60_000,
        members: &members,
    }
    .call(&client)
    .await
    .expect("the lease runs");
    out.push(i64::try_from(moved).unwrap());
    let pttl: i64 = client.pttl(&q.batches).await.unwrap();
    out.push(i64::from(pttl > 0 && pttl <= 60_000));
    // A claim of the old form, left by a worker of the version before, and the second batch,
    // both stale: both swept back.
    let _: i64 = client.lpush(&q.processing, "old").await.unwrap();
    let _: i64 = client
        .zadd(
            &q.zset,
            None,
            None,
            false,
            false,
            vec![(1.0, "r0:7.1.2:old"), (1.0, second.as_str())],
        )
        .await
        .unwrap();
    let (recovered, _, _) = q.claim(&client, 0, 9, 60_000).await;
    out.push(i64::try_from(recovered).unwrap());
    let (l, p, z, h) = q.sizes(&client).await;
    out.extend([l, p, z, h]);
    q.clean(&client).await;
    out
}

#[tokio::test]
async fn a_resent_claim_records_a_batch_of_its_own_and_old_claims_are_still_swept() {
    // two ids; 2 members, 4 fields; owned 1; 1 moved; ttl set; 2 recovered; queue 2, the rest
    // empty.
    on_both(
        "batches-resent",
        vec![1, 2, 4, 1, 1, 1, 2, 2, 0, 0, 0],
        resent,
    )
    .await;
}

/// A stale batch of three, swept at most two entries a run: the first run moves two back and
/// marks them (the batch stays, stale), the second the last one, and the record is gone; a
/// settle of a swept entry in between finds nothing. Returns what each step saw.
async fn partial(client: Client, prefix: String) -> Vec<i64> {
    let q = Q::new(&prefix);
    let mut out = Vec::new();
    let _: i64 = client
        .rpush(&q.levels[0], vec!["c", "b", "a"])
        .await
        .unwrap();
    let (_, id, _) = q.claim(&client, 3, 0, NEVER).await;
    let _: i64 = client
        .zadd(&q.zset, None, None, false, false, vec![(1.0, id.as_str())])
        .await
        .unwrap();
    let (recovered, _, _) = q.claim_most(&client, 0, 3, 60_000, 2).await;
    out.push(i64::try_from(recovered).unwrap());
    let (l, p, z, h) = q.sizes(&client).await;
    out.extend([l, p, z, h]);
    out.push(q.settle(&client, &[(b"a", &id, 0, Op::Ack)]).await);
    let (recovered, _, _) = q.claim_most(&client, 0, 3, 60_000, 2).await;
    out.push(i64::try_from(recovered).unwrap());
    let (l, p, z, h) = q.sizes(&client).await;
    out.extend([l, p, z, h]);
    q.clean(&client).await;
    out
}

#[tokio::test]
async fn a_sweep_takes_at_most_its_bound_of_entries_and_marks_a_batch_swept_in_part() {
    // 2 swept: queue 2, processing 1, the batch kept (1 member, 2 fields); the swept a not
    // owned; then 1 swept: queue 3, the rest empty.
    on_both(
        "batches-partial",
        vec![2, 2, 1, 1, 2, 0, 1, 3, 0, 0, 0],
        partial,
    )
    .await;
}
