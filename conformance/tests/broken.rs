//! The suite can fail: backends with one deliberate flaw each must fail the property
//! that guards against it, while the sound backend passes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::memory::MemoryFixture;
use dlock_conformance::properties::{self, Case};
use dlock_conformance::{Evict, Faults, FaultyClient, Fixture, FullFixture, Restart, Storage, Timing};
use dlock_core::backend::{Attempt, Backend, Release, Renewal, Request};
use dlock_core::memory::{MemoryBackend, MemoryHold, MemoryStore, MemoryTicket};
use dlock_core::{
    Capabilities, Client, ClientConfig, FencingToken, HoldKind, LockError, LockInfo, LockName, Locker, StoredResult,
    Swept,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// Release frees the lock whoever holds it.
    ReleaseSkipsOwnerCheck,
    /// Renew reports success without renewing.
    NeverRenews,
    /// Claims notification but only wakes at the timed fallback.
    ClaimsNotifyButSleeps,
    /// Hands out the same token every time.
    ConstantToken,
    /// Grants without checking for a holder.
    NoExclusion,
    /// Leaves the grant of an attempt whose reply was lost in place.
    NoGiveBack,
    /// Stores a run's result without checking that its hold is still the live one.
    StoreSkipsHoldCheck,
    /// Admits one permit more than the request's number.
    OnePermitTooMany,
    /// Grants permits one holder at a time, as if they were a mutex.
    PermitsExclude,
    /// Hands a lock from one task of a client to another that queued behind it without a
    /// fresh token: the waiter reports the token of the task it queued behind.
    LocalHandOffKeepsToken,
    /// Never queues a permit request, so a larger request overtakes a smaller one waiting.
    PermitsJumpTheQueue,
    /// Sweeps nothing: what it keeps for idle names stays for ever.
    SweepsNothing,
}

struct Broken {
    inner: MemoryBackend,
    store: MemoryStore,
    flaw: Flaw,
    /// Where the flawed store keeps results, shared by the fixture's clients.
    results: Arc<Mutex<HashMap<LockName, StoredResult>>>,
    /// This client's live grants, by lock, with the token each reported.
    mine: Mutex<HashMap<LockName, FencingToken>>,
    /// Requests that found a task of this client holding their lock, with its token.
    behind: Mutex<HashMap<String, FencingToken>>,
}

struct BrokenHold {
    inner: MemoryHold,
    name: LockName,
}

#[async_trait]
impl Backend for Broken {
    type Hold = BrokenHold;
    type Ticket = MemoryTicket;

    fn name(&self) -> &'static str {
        "broken"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn grants_in_request_order(&self, req: &Request) -> bool {
        self.inner.grants_in_request_order(req)
    }

    async fn attempt(
        &self,
        req: &Request,
        ticket: &mut Option<MemoryTicket>,
    ) -> Result<Attempt<BrokenHold>, LockError> {
        if self.flaw == Flaw::NoExclusion {
            self.store.evict(&req.name);
        }
        let mut req = req.clone();
        if let HoldKind::Permit { permits } = req.kind {
            match self.flaw {
                Flaw::OnePermitTooMany => req.kind = HoldKind::Permit { permits: permits + 1 },
                Flaw::PermitsExclude => req.kind = HoldKind::Permit { permits: 1 },
                Flaw::PermitsJumpTheQueue => req.blocking = false,
                _ => {}
            }
        }
        let req = &req;
        Ok(match self.inner.attempt(req, ticket).await? {
            Attempt::Granted { hold, token } => {
                let token = match self.flaw {
                    Flaw::ConstantToken => FencingToken::new(1),
                    Flaw::LocalHandOffKeepsToken => {
                        let token = self.behind.lock().unwrap().remove(req.id.as_str()).unwrap_or(token);
                        self.mine.lock().unwrap().insert(req.name.clone(), token);
                        token
                    }
                    _ => token,
                };
                Attempt::Granted { hold: BrokenHold { inner: hold, name: req.name.clone() }, token }
            }
            Attempt::Busy { retry_after } => {
                if let Some(&held) = self.mine.lock().unwrap().get(&req.name) {
                    self.behind.lock().unwrap().entry(req.id.as_str().to_string()).or_insert(held);
                }
                Attempt::Busy { retry_after }
            }
        })
    }

    async fn wait(
        &self,
        req: &Request,
        ticket: &mut Option<MemoryTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        if self.flaw == Flaw::ClaimsNotifyButSleeps {
            tokio::time::sleep_until(until).await;
            return Ok(());
        }
        self.inner.wait(req, ticket, until).await
    }

    async fn abandon(&self, req: &Request, ticket: MemoryTicket) {
        self.inner.abandon(req, ticket).await
    }

    async fn give_back(&self, req: &Request, ticket: Option<MemoryTicket>) {
        if self.flaw == Flaw::NoGiveBack {
            if let Some(ticket) = ticket {
                self.inner.abandon(req, ticket).await;
            }
            return;
        }
        self.inner.give_back(req, ticket).await
    }

    async fn renew(&self, hold: &BrokenHold, ttl: Duration) -> Result<Renewal, LockError> {
        if self.flaw == Flaw::NeverRenews {
            return Ok(Renewal::Renewed);
        }
        self.inner.renew(&hold.inner, ttl).await
    }

    async fn release(&self, hold: &BrokenHold) -> Result<Release, LockError> {
        if self.flaw == Flaw::ReleaseSkipsOwnerCheck {
            self.store.evict(&hold.name);
            return Ok(Release::Released);
        }
        self.mine.lock().unwrap().remove(&hold.name);
        self.inner.release(&hold.inner).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        self.inner.inspect(name).await
    }

    async fn store_result(
        &self,
        hold: &BrokenHold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        if self.flaw == Flaw::StoreSkipsHoldCheck {
            let record = StoredResult { token, value: value.to_vec() };
            self.results.lock().unwrap().insert(hold.name.clone(), record);
            return Ok(());
        }
        self.inner.store_result(&hold.inner, token, value, retention).await
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        if self.flaw == Flaw::StoreSkipsHoldCheck {
            return Ok(self.results.lock().unwrap().get(name).cloned());
        }
        self.inner.load_result(name).await
    }

    async fn sweep(&self) -> Result<Swept, LockError> {
        if self.flaw == Flaw::SweepsNothing {
            return Ok(Swept::default());
        }
        self.inner.sweep().await
    }

    fn target(&self) -> String {
        self.inner.target()
    }
}

struct BrokenFixture {
    sound: MemoryFixture,
    flaw: Flaw,
    results: Arc<Mutex<HashMap<LockName, StoredResult>>>,
}

impl BrokenFixture {
    fn client_of(&self, inner: MemoryBackend) -> Arc<dyn Locker> {
        let (store, flaw, results) = (self.sound.store().clone(), self.flaw, self.results.clone());
        let backend = Broken { inner, store, flaw, results, mine: Mutex::default(), behind: Mutex::default() };
        Arc::new(Client::with_config(backend, ClientConfig::with_op_timeout(Duration::from_secs(1))))
    }
}

#[async_trait]
impl Fixture for BrokenFixture {
    fn timing(&self) -> Timing {
        self.sound.timing()
    }

    async fn client(&self) -> Arc<dyn Locker> {
        self.client_of(self.sound.store().backend())
    }
}

#[async_trait]
impl Evict for BrokenFixture {
    async fn evict(&self, name: &LockName) {
        self.sound.evict(name).await
    }
}

#[async_trait]
impl Faults for BrokenFixture {
    async fn faulty_client(&self) -> FaultyClient {
        let inner = self.sound.store().backend();
        let link = inner.link();
        FaultyClient { locker: self.client_of(inner), link: Box::new(link) }
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        self.sound.unreachable_client(timeout).await
    }
}

#[async_trait]
impl Storage for BrokenFixture {
    async fn records(&self, prefix: &str) -> usize {
        self.sound.records(prefix).await
    }
}

#[async_trait]
impl Restart for BrokenFixture {
    async fn stop_backend(&self) {
        self.sound.stop_backend().await
    }

    async fn start_backend(&self) {
        self.sound.start_backend().await
    }
}

fn case(name: &str) -> Case {
    properties::cases().into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case {name}"))
}

/// Runs a case in its own task; true when it passed, false when it panicked.
async fn passes(fixture: Box<dyn FullFixture>, case: Case) -> bool {
    let run = tokio::spawn(async move { case.run(&*fixture).await });
    match run.await {
        Ok(()) => true,
        Err(e) if e.is_panic() => false,
        Err(e) => panic!("case {} did not finish: {e}", case.name),
    }
}

async fn assert_caught(flaw: Flaw, case_name: &str) {
    let case = case(case_name);
    assert!(passes(Box::new(MemoryFixture::new()), case).await, "the sound backend must pass {case_name}");
    assert!(!passes(broken(flaw), case).await, "{case_name} did not catch a backend with {flaw:?}");
}

fn broken(flaw: Flaw) -> Box<dyn FullFixture> {
    Box::new(BrokenFixture { sound: MemoryFixture::new(), flaw, results: Arc::default() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_release_without_owner_check() {
    assert_caught(Flaw::ReleaseSkipsOwnerCheck, "stale_lease_cannot_release_or_extend").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_watchdog_that_never_renews() {
    assert_caught(Flaw::NeverRenews, "watchdog_keeps_lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_false_claim_of_notification() {
    assert_caught(Flaw::ClaimsNotifyButSleeps, "waiter_wakes_on_release").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_tokens_that_do_not_increase() {
    assert_caught(Flaw::ConstantToken, "tokens_increase_across_holders").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_missing_mutual_exclusion() {
    assert_caught(Flaw::NoExclusion, "mutual_exclusion").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_a_result_stored_without_the_hold() {
    assert_caught(Flaw::StoreSkipsHoldCheck, "idempotent_late_result_is_refused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_orphan_grants_of_lost_replies() {
    assert_caught(Flaw::NoGiveBack, "acquire_whose_reply_was_lost_leaves_no_hold").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_a_permit_too_many() {
    assert_caught(Flaw::OnePermitTooMany, "semaphore_admits_at_most_n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_permits_that_exclude_each_other() {
    assert_caught(Flaw::PermitsExclude, "semaphore_admits_at_most_n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_a_hand_off_inside_a_client_that_keeps_the_token() {
    assert_caught(Flaw::LocalHandOffKeepsToken, "fair_order_holds_within_one_client").await;
    // Waiters on clients of their own never queue behind a task of their client.
    let across = case("fair_grants_follow_request_order");
    assert!(passes(broken(Flaw::LocalHandOffKeepsToken), across).await, "the flaw lies inside one client only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_a_larger_permit_request_overtaking_a_smaller_one() {
    assert_caught(Flaw::PermitsJumpTheQueue, "semaphore_mixed_counts_never_crowd_a_holder").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_idle_names_that_never_go() {
    assert_caught(Flaw::SweepsNothing, "idle_names_leave_nothing_behind").await;
}
