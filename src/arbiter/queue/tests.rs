//! Unit tests of the GPU queue: FIFO within a priority, positions, exclusive and shared
//! grants, packing by memory, backfill, blocks.

use super::*;

mod cpu_jobs;

fn lease(name: &str, priority: i32) -> Ticket {
    Ticket {
        need_mib: None,
        kind: HolderKind::Lease,
        label: name.into(),
        priority,
        on_cpu: false,
    }
}

#[tokio::test]
async fn fifo_positions_and_leaving() {
    let q = GpuQueue::new(1);
    let a = q.enqueue();
    let first = a.granted().await;
    let b = q.enqueue();
    let c = q.enqueue();
    let d = q.enqueue();
    assert_eq!(
        (b.position(), c.position(), d.position()),
        (Some(1), Some(2), Some(3))
    );
    drop(c);
    assert_eq!(d.position(), Some(2));
    drop(b);
    assert_eq!(d.position(), Some(1));
    drop(first);
    let _second = d.granted().await;
    assert_eq!(q.running(), 1);
    assert_eq!(q.waiting(), 0);
}

#[tokio::test]
async fn granted_but_dropped_waiter_releases() {
    let q = GpuQueue::new(1);
    let a = q.enqueue();
    let p = a.granted().await;
    let b = q.enqueue();
    let c = q.enqueue();
    drop(p); // b is granted now
    drop(b); // …and never takes it
    let _pc = c.granted().await;
    assert_eq!(q.running(), 1);
}

#[tokio::test]
async fn bounded_waiting() {
    let q = GpuQueue::new(1);
    let running = q.try_enqueue(Ticket::job(0), 1).unwrap();
    let _permit = running.granted().await;
    let waiting = q.try_enqueue(Ticket::job(0), 1).unwrap();
    assert!(
        q.try_enqueue(Ticket::job(0), 1).is_none(),
        "one waits already"
    );
    drop(waiting);
    assert!(q.try_enqueue(Ticket::job(0), 1).is_some());
}

#[tokio::test]
async fn capacity_two() {
    let q = GpuQueue::new(2);
    let a = q.enqueue();
    let b = q.enqueue();
    let c = q.enqueue();
    let _pa = a.granted().await;
    let _pb = b.granted().await;
    assert_eq!(c.position(), Some(1));
}

#[tokio::test]
async fn exclusive_grants_wait_for_all_and_block_all() {
    let q = GpuQueue::new(2);
    let job = q.enqueue().granted().await;
    let l = q.try_enqueue(lease("l", 0), 10).unwrap();
    let later_job = q.enqueue();
    assert_eq!(
        (l.position(), later_job.position()),
        (Some(1), Some(2)),
        "no overtaking"
    );
    drop(job);
    let held = l.granted().await;
    assert!(q.exclusive_held());
    assert_eq!(later_job.position(), Some(1));
    drop(held);
    let _j = later_job.granted().await;
}

#[tokio::test]
async fn priority_orders_waiters_without_preemption() {
    let q = GpuQueue::new(1);
    let running = q.enqueue().granted().await;
    let batch = q.try_enqueue(lease("batch", 0), 10).unwrap();
    let urgent = q.try_enqueue(lease("urgent", 5), 10).unwrap();
    assert_eq!((urgent.position(), batch.position()), (Some(1), Some(2)));
    assert_eq!(q.running(), 1, "the running job keeps the GPU");
    drop(running);
    let _u = urgent.granted().await;
}

#[tokio::test]
async fn a_block_stops_every_grant() {
    let q = GpuQueue::new(1);
    q.block(Block::Teardown(0), "memory of vllm never came back".into());
    let w = q.enqueue();
    assert_eq!(w.position(), Some(1));
    assert!(q.waiting_for().unwrap().contains("never came back"));
    q.unblock(&Block::Teardown(0));
    let _p = w.granted().await;
}

#[tokio::test]
async fn backfill_lets_what_fits_go_ahead_only_when_allowed() {
    use super::super::sharing::Room;
    for allow_backfill in [false, true] {
        let q = GpuQueue::with_sharing(
            1,
            Arc::new(History::new(std::time::Duration::from_secs(60))),
            Sharing {
                mode: ShareMode::Vram,
                headroom_mib: 0,
                allow_backfill,
            },
            0,
        );
        q.set_room(RoomSource(Box::new(|| {
            Some(Room {
                total_mib: 10_000,
                free_mib: 10_000,
                residents_mib: 0,
                unloaded_residents_mib: 0,
            })
        })));
        let sized = |name: &str, mib| Ticket {
            need_mib: Some(mib),
            ..lease(name, 0)
        };
        let _big = take(&q, "big", 6_000).await;
        let huge = q.try_enqueue(sized("huge", 8_000), 9).unwrap();
        let small = q.try_enqueue(sized("small", 2_000), 9).unwrap();
        assert_eq!(huge.position(), Some(1));
        assert_eq!(
            small.position(),
            if allow_backfill { None } else { Some(2) }
        );
        // While residents are unloaded for the first waiter, nothing takes the room being made.
        q.unloading_for_head
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let later = q.try_enqueue(sized("later", 1_000), 9).unwrap();
        assert_eq!(later.position(), Some(if allow_backfill { 2 } else { 3 }));
        // It waits, so it counts against the queue's bound (it went past it as if granted).
        assert!(q.try_enqueue(sized("over", 1_000), 2).is_none());
        q.unloading_for_head
            .store(false, std::sync::atomic::Ordering::SeqCst);
        q.redispatch();
        assert_eq!(
            later.position(),
            if allow_backfill { None } else { Some(3) }
        );
    }
}

#[tokio::test]
async fn a_closed_queue_grants_nothing_and_tells_its_waiters() {
    let q = GpuQueue::new(1);
    let held = q.enqueue().granted().await;
    let mut waiting = q.enqueue();
    q.close();
    assert!(matches!(waiting.next().await, Turn::Closed));
    drop(held);
    assert_eq!(waiting.position(), Some(1), "granted after the close");
    assert!(waiting.granted().await.is_none());
    q.unblock(&Block::Teardown(0));
    assert!(
        q.enqueue().granted().await.is_none(),
        "an unblock reopened it"
    );
}

#[tokio::test]
async fn a_waiter_is_told_its_position_then_the_grant_or_the_close() {
    let q = GpuQueue::new(1);
    let held = q.enqueue().granted().await;
    let ahead = q.enqueue();
    let mut mine = q.enqueue();
    assert!(
        matches!(mine.next().await, Turn::Waiting { position: 2, .. }),
        "told at once"
    );
    drop(ahead);
    assert!(
        matches!(mine.next().await, Turn::Waiting { position: 1, .. }),
        "told when it moves"
    );
    drop(held);
    let Turn::Granted(permit) = mine.next().await else {
        panic!("not granted");
    };
    assert_eq!(q.running(), 1);
    drop(permit);
    assert_eq!(q.running(), 0);

    // A grant not yet taken when the queue closes is given back, not used.
    let held = q.enqueue().granted().await;
    let mut late = q.enqueue();
    assert!(matches!(
        late.next().await,
        Turn::Waiting { position: 1, .. }
    ));
    drop(held); // granted to `late` now
    q.close();
    assert!(matches!(late.next().await, Turn::Closed));
    drop(late);
    assert_eq!(q.running(), 0, "the grant went back");

    // The same when the grant reaches a waiter already waiting, and the queue closes before it
    // runs again.
    let q = GpuQueue::new(1);
    let held = q.enqueue().granted().await;
    let mut late = q.enqueue();
    assert!(matches!(
        late.next().await,
        Turn::Waiting { position: 1, .. }
    ));
    {
        let mut waiting = std::pin::pin!(late.next());
        // Polled once: it waits for the grant or a change.
        let once = tokio::time::timeout(std::time::Duration::ZERO, &mut waiting).await;
        assert!(once.is_err(), "nothing to tell yet");
        drop(held);
        q.close();
        assert!(matches!(waiting.await, Turn::Closed));
    }
    drop(late);
    assert_eq!(q.running(), 0, "the grant went back");
}

#[tokio::test]
async fn a_waiter_is_told_when_what_it_waits_for_changes() {
    let q = GpuQueue::new(1);
    let held = q
        .try_enqueue(lease("lease 1 (alice)", 0), usize::MAX)
        .unwrap()
        .granted()
        .await
        .unwrap();
    let mut mine = q.enqueue();
    // What the next turn tells: first place, waiting for what.
    async fn told(waiter: &mut Waiter) -> Option<String> {
        match waiter.next().await {
            Turn::Waiting {
                position: 1,
                waiting_for,
            } => waiting_for,
            other => panic!("not waiting first: {other:?}"),
        }
    }
    assert_eq!(told(&mut mine).await.as_deref(), Some("lease 1 (alice)"));
    // The lease ends and its memory does not come back: the same place in the queue, but
    // another reason to wait (it said "lease 1" while no lease was left).
    q.block(
        Block::Teardown(0),
        "the memory of lease 1 did not come back".into(),
    );
    drop(held);
    assert_eq!(
        told(&mut mine).await.as_deref(),
        Some("the memory of lease 1 did not come back")
    );
    q.unblock(&Block::Teardown(0));
    assert!(matches!(mine.next().await, Turn::Granted(_)));
}

#[tokio::test]
async fn each_block_is_lifted_on_its_own() {
    let q = GpuQueue::new(1);
    q.block(
        Block::Teardown(1),
        "the memory of lease 1 did not come back".into(),
    );
    q.block(
        Block::Loading("vllm".into()),
        "the memory of lease 2 did not come back".into(),
    );
    let w = q.enqueue();
    // Lease 2's memory came back, lease 1's did not: still nothing is granted (one unblock
    // lifted every block).
    q.unblock(&Block::Loading("vllm".into()));
    assert_eq!(w.position(), Some(1));
    assert_eq!(
        q.blocked().as_deref(),
        Some("the memory of lease 1 did not come back")
    );
    assert!(q.blocked_by(&Block::Teardown(1)) && !q.blocked_by(&Block::Loading("vllm".into())));
    q.unblock(&Block::Teardown(1));
    let _p = w.granted().await;
    assert!(q.blocked().is_none());
}

/// A granted request of `mib` on `q`.
async fn take(q: &Arc<GpuQueue>, name: &str, mib: u64) -> Option<GpuPermit> {
    q.try_enqueue(sized(name, mib), 9).unwrap().granted().await
}

/// An 80 GB GPU with `free_mib` free and no residents.
fn gpu_80g(free_mib: u64) -> super::super::sharing::Room {
    super::super::sharing::Room {
        total_mib: 80_000,
        free_mib,
        residents_mib: 0,
        unloaded_residents_mib: 0,
    }
}

/// A queue sharing by memory over a device whose memory the test sets.
fn shared(
    max_running: usize,
    headroom_mib: u64,
) -> (
    Arc<GpuQueue>,
    Arc<std::sync::Mutex<super::super::sharing::Room>>,
) {
    use super::super::sharing::Room;
    let q = GpuQueue::with_sharing(
        max_running,
        Arc::new(History::new(std::time::Duration::from_secs(60))),
        Sharing {
            mode: ShareMode::Vram,
            headroom_mib,
            allow_backfill: false,
        },
        0,
    );
    let room = Arc::new(std::sync::Mutex::new(Room {
        total_mib: 32_607,
        free_mib: 12_095,
        residents_mib: 0,
        unloaded_residents_mib: 0,
    }));
    let source = Arc::clone(&room);
    q.set_room(RoomSource(Box::new(move || Some(*source.lock().unwrap()))));
    (q, room)
}

fn sized(name: &str, mib: u64) -> Ticket {
    Ticket {
        need_mib: Some(mib),
        ..lease(name, 0)
    }
}

#[tokio::test]
async fn what_a_holder_reserved_and_has_not_taken_is_not_free() {
    // 12 095 MiB free (someone outside uses 20 512), 1 024 kept free. A reserves 8 000: B's
    // 8 000 and C's 3 500 were granted beside it while A had allocated nothing yet.
    let (q, _) = shared(1, 1_024);
    let _a = q.try_enqueue(sized("A", 8_000), 9).unwrap().granted().await;
    for (name, mib) in [("B", 8_000), ("C", 3_500)] {
        let w = q.try_enqueue(sized(name, mib), 9).unwrap();
        assert_eq!(
            w.position(),
            Some(1),
            "{name} granted beside A's reservation"
        );
    }
    // What is left (3 000 + 1 024 ≤ 12 095 − 8 000) is granted.
    let (q, room) = shared(1, 1_024);
    let _a = q.try_enqueue(sized("A", 8_000), 9).unwrap().granted().await;
    let d = q.try_enqueue(sized("D", 3_000), 9).unwrap().granted().await;
    // Once A has taken its memory, the 4 095 MiB the sample shows free are not counted
    // short again: E's 3 000 beside A alone fits as D's did.
    drop(d);
    room.lock().unwrap().free_mib = 4_095;
    let _e = q.try_enqueue(sized("E", 3_000), 9).unwrap().granted().await;
}

#[tokio::test]
async fn a_request_that_fits_behind_a_waiter_counts_as_waiting() {
    // limits.max_queue was passed by small leases that fit beside the holders but stood in
    // line behind a big one: each counted as "granted at once".
    let (q, _room) = shared(1, 0);
    let _big = q
        .try_enqueue(sized("big1", 12_000), 2)
        .unwrap()
        .granted()
        .await;
    let _big2 = q.try_enqueue(sized("big2", 20_000), 2).unwrap();
    let _small = q.try_enqueue(sized("small1", 10), 2).unwrap();
    assert!(
        q.try_enqueue(sized("small2", 10), 2).is_none(),
        "a third waiter past max_waiting 2"
    );
}

#[tokio::test]
async fn a_job_waiting_only_for_a_job_slot_waits_for_no_service() {
    // share = "vram": a service and a job hold the GPU; the next job waits for the job's slot
    // (max_concurrent_jobs 1), not for the service's memory.
    let (q, _room) = shared(1, 0);
    let service = Ticket {
        kind: HolderKind::Service,
        ..sized("service llm", 1_000)
    };
    let _svc = q.try_enqueue(service, 9).unwrap().granted().await;
    let _job = q.enqueue().granted().await;
    let next = q.enqueue();
    assert_eq!(next.position(), Some(1));
    assert!(!q.head_waits_for_room());
    // Exclusive: a job behind a service waits for the service itself.
    let q = GpuQueue::new(1);
    let _svc = q
        .try_enqueue(
            Ticket {
                kind: HolderKind::Service,
                ..lease("service llm", 0)
            },
            9,
        )
        .unwrap()
        .granted()
        .await;
    let _next = q.enqueue();
    assert!(q.head_waits_for_room());
}

#[tokio::test]
async fn what_a_holder_that_ends_had_taken_leaves_with_it() {
    // 80 000 MiB, 1 000 kept free. a and b take 30 000 each; a ends. b's 30 000 were counted
    // short a second time (it had taken them before a ended), and 25 000 beside b waited. With
    // a sample dispatched on between a's exit and its permit's going (the usual order: the
    // teardown check waits for that sample), grant order gave a the 30 000 b uses, and b read
    // as having taken nothing until it ended.
    for sample_before_release in [false, true] {
        let (q, room) = shared(1, 1_000);
        *room.lock().unwrap() = gpu_80g(80_000);
        let a = take(&q, "a", 30_000).await;
        room.lock().unwrap().free_mib = 50_000;
        q.redispatch();
        let _b = take(&q, "b", 30_000).await;
        room.lock().unwrap().free_mib = 20_000;
        q.redispatch();
        // a's memory is back, then its permit goes.
        room.lock().unwrap().free_mib = 50_000;
        if sample_before_release {
            q.redispatch();
        }
        drop(a);
        let c = q.try_enqueue(sized("c", 25_000), 9).unwrap();
        assert_eq!(
            c.position(),
            None,
            "c waits beside b's 30 000 counted twice (sample before release: {sample_before_release})"
        );
    }
}

#[tokio::test]
async fn memory_an_outside_server_gives_back_is_no_holders() {
    // The first holder's room was made by a watched server freeing 20 000 MiB (Ollama asked to
    // unload): that drop is not the holder's memory coming and going.
    let (q, room) = shared(1, 1_000);
    *room.lock().unwrap() = gpu_80g(60_000);
    let _a = take(&q, "a", 30_000).await;
    room.lock().unwrap().free_mib = 80_000; // the server's 20 000 are back
    q.redispatch();
    room.lock().unwrap().free_mib = 50_000; // a takes its 30 000
    q.redispatch();
    let b = q.try_enqueue(sized("b", 40_000), 9).unwrap();
    assert_eq!(b.position(), None, "b waits for memory a never had");
}

#[tokio::test]
async fn a_job_that_loads_a_model_fits_beside_a_lease_only_with_room_for_it() {
    // A one-shot stage's model is the job's own need: a job of loaded residents (0) goes beside
    // a lease that leaves little free; one whose stage loads 6 GB there waits for the lease.
    use super::super::sharing::Room;
    let q = GpuQueue::with_sharing(
        2,
        Arc::new(History::new(std::time::Duration::from_secs(60))),
        Sharing {
            mode: ShareMode::Vram,
            headroom_mib: 0,
            allow_backfill: true,
        },
        0,
    );
    q.set_room(RoomSource(Box::new(|| {
        Some(Room {
            total_mib: 10_000,
            free_mib: 10_000,
            residents_mib: 0,
            unloaded_residents_mib: 0,
        })
    })));
    let lease = Ticket {
        need_mib: Some(6_000),
        ..lease("notebook", 0)
    };
    let _held = q.try_enqueue(lease, 9).unwrap().granted().await;
    let loads = Ticket {
        need_mib: Some(6_000),
        ..Ticket::job(0)
    };
    let loading = q.try_enqueue(loads, 9).unwrap();
    assert_eq!(
        loading.position(),
        Some(1),
        "granted beside a lease it cannot fit beside"
    );
    let resident = q.try_enqueue(Ticket::job(0), 9).unwrap();
    assert_eq!(resident.position(), None, "a job of loaded workers waited");
}

#[tokio::test]
async fn a_job_held_for_its_one_shot_stage_lets_jobs_of_loaded_workers_go() {
    // A watched program loads: a job whose one-shot stage loads a model waits; the enrolment
    // behind it, on loaded workers only, took nothing it waits for and waited all the same.
    use super::super::sharing::Room;
    let q = GpuQueue::new(1);
    q.set_room(RoomSource(Box::new(|| {
        Some(Room {
            total_mib: 32_000,
            free_mib: 30_000,
            residents_mib: 2_000,
            unloaded_residents_mib: 0,
        })
    })));
    q.block(Block::Loading("vllm".into()), "vllm loads".into());
    let loads = Ticket {
        need_mib: Some(2_000),
        ..Ticket::job(0)
    };
    let held = q.try_enqueue(loads.clone(), 1).unwrap();
    let also_held = q.try_enqueue(loads, 2).unwrap();
    // Not counted as waiting (max_queue 2 with two waiters): it goes at once, past both.
    let resident = q
        .try_enqueue(Ticket::job(0), 2)
        .expect("refused as a waiter");
    assert_eq!(resident.position(), None, "waited behind the held jobs");
    assert_eq!((held.position(), also_held.position()), (Some(1), Some(2)));
    // A lease behind the held jobs stays behind them (and is held itself).
    let lease = q.try_enqueue(lease("l", 0), 9).unwrap();
    assert_eq!(lease.position(), Some(3));
    drop(resident);
    q.unblock(&Block::Loading("vllm".into()));
    let _job = held.granted().await;
}

#[tokio::test]
async fn a_waiter_that_leaves_lets_the_one_behind_it_go() {
    // Two jobs may run at once; a job runs, a lease waits for the GPU to empty, a job waits
    // behind the lease (first come, first served). The lease's client gives up: the job behind
    // it fits beside the running one, and waited until something else moved the queue.
    let q = GpuQueue::new(2);
    let _running = q.enqueue().granted().await;
    let lease = q.try_enqueue(lease("l", 0), 9).unwrap();
    let behind = q.enqueue();
    assert_eq!((lease.position(), behind.position()), (Some(1), Some(2)));
    drop(lease);
    assert_eq!(behind.position(), None, "still waiting for nothing");
}

#[tokio::test]
async fn a_job_granted_with_others_counts_the_residents_it_reloads() {
    // 32 000 MiB, 1 000 kept free; a 4 000 MiB resident was unloaded for a lease of unknown
    // size. When that lease ends, a 25 000 lease, a job (which reloads the resident) and a
    // 6 000 service are granted in one go: the service was checked as if the job reloaded
    // nothing (35 000 reserved on a 32 000 GPU).
    let (q, room) = shared(2, 1_000);
    *room.lock().unwrap() = super::super::sharing::Room {
        total_mib: 32_000,
        free_mib: 32_000,
        residents_mib: 0,
        unloaded_residents_mib: 4_000,
    };
    let alone = q.try_enqueue(lease("alone", 0), 9).unwrap().granted().await;
    let big = q.try_enqueue(sized("big", 25_000), 9).unwrap();
    let job = q.try_enqueue(Ticket::job(0), 9).unwrap();
    let service = Ticket {
        kind: HolderKind::Service,
        ..sized("service", 6_000)
    };
    let service = q.try_enqueue(service, 9).unwrap();
    drop(alone);
    assert_eq!((big.position(), job.position()), (None, None));
    assert_eq!(service.position(), Some(1), "granted past the GPU's memory");
}
