//! Unit tests of jobs on the CPU (`Ticket::on_cpu`): they take nothing of the GPU, so they run
//! beside exclusive holders and past waiters, and count only among the jobs.

use super::*;

fn on_cpu() -> Ticket {
    Ticket {
        on_cpu: true,
        label: "speech job on the CPU".into(),
        ..Ticket::job(0)
    }
}

fn enqueue(q: &Arc<GpuQueue>, ticket: Ticket) -> Waiter {
    q.try_enqueue(ticket, usize::MAX).unwrap()
}

#[tokio::test]
async fn a_job_on_the_cpu_runs_beside_a_lease_and_past_the_jobs_that_wait_for_it() {
    let q = GpuQueue::new(2);
    let held = enqueue(&q, lease("alice", 0)).granted().await.unwrap();
    let on_gpu = q.enqueue();
    assert_eq!(
        on_gpu.position(),
        Some(1),
        "a job on the GPU waits for the lease"
    );
    let first = enqueue(&q, on_cpu());
    assert_eq!(
        first.position(),
        None,
        "granted beside the lease, past the waiter"
    );
    let _first = first.granted().await.unwrap();
    // The lease ends: the job on the GPU goes, and the two hold the two job places.
    drop(held);
    let _on_gpu = on_gpu.granted().await.unwrap();
    assert_eq!(q.running(), 2);
    let second = enqueue(&q, on_cpu());
    assert_eq!(
        second.position(),
        Some(1),
        "it counts among max_concurrent_jobs"
    );
    assert!(
        !q.head_waits_for_room(),
        "it waits for a place among jobs, not for room"
    );
}

#[tokio::test]
async fn a_lease_or_service_is_granted_beside_jobs_on_the_cpu_only() {
    let q = GpuQueue::new(2);
    let _cpu = enqueue(&q, on_cpu()).granted().await.unwrap();
    let lease_now = enqueue(&q, lease("alice", 0));
    assert_eq!(lease_now.position(), None, "nothing of the GPU is held");
    assert_eq!(q.gpu_holders(), 1);
    drop(lease_now.granted().await.unwrap());
    // Beside a job on the GPU it waits, as ever.
    let on_gpu = q.enqueue().granted().await.unwrap();
    let service = enqueue(
        &q,
        Ticket {
            kind: HolderKind::Service,
            ..lease("service llm", 0)
        },
    );
    assert_eq!(service.position(), Some(1));
    drop(on_gpu);
    let _service = service.granted().await.unwrap();
}

#[tokio::test]
async fn a_job_on_the_cpu_is_held_by_neither_a_block_nor_a_loading_program() {
    let q = GpuQueue::new(1);
    q.block(
        Block::Teardown(0),
        "the memory of vllm never came back".into(),
    );
    q.block(Block::Loading("vllm".into()), "vllm loads".into());
    let on_gpu = q.enqueue();
    assert_eq!(on_gpu.position(), Some(1));
    let cpu = enqueue(&q, on_cpu());
    assert_eq!(
        cpu.position(),
        None,
        "past the blocks and the job held by them"
    );
    let _cpu = cpu.granted().await.unwrap();
    // At shutdown nothing is granted, on the CPU either.
    q.close();
    drop(_cpu);
    assert!(enqueue(&q, on_cpu()).granted().await.is_none());
}

#[tokio::test]
async fn a_job_on_the_cpu_that_waits_for_a_job_place_holds_nobody_up() {
    let q = GpuQueue::new(1);
    let _running = enqueue(&q, on_cpu()).granted().await.unwrap();
    let waits = enqueue(&q, on_cpu());
    assert_eq!(waits.position(), Some(1), "one job place, taken");
    // A lease needs the GPU, which neither job holds: it goes past the waiting one at once.
    let lease_now = enqueue(&q, lease("alice", 0));
    assert_eq!(lease_now.position(), None);
    let _lease = lease_now.granted().await.unwrap();
    // A job on the GPU behind them waits, for the lease and a job place.
    let on_gpu = q.enqueue();
    assert_eq!(on_gpu.position(), Some(2));
    assert_eq!(q.gpu_holders(), 1);
}

#[tokio::test]
async fn the_first_waiter_that_needs_the_gpu_is_the_one_that_waits_for_room() {
    let q = GpuQueue::new(1);
    let _running = enqueue(&q, on_cpu()).granted().await.unwrap();
    let service = Ticket {
        kind: HolderKind::Service,
        ..lease("service llm", 0)
    };
    let _service = enqueue(&q, service).granted().await.unwrap();
    let _waits = enqueue(&q, on_cpu());
    assert!(!q.head_waits_for_room(), "a job on the CPU needs no room");
    // A lease behind it waits for the service's GPU: a service idle long enough yields to it.
    let _lease = enqueue(&q, lease("alice", 0));
    assert!(q.head_waits_for_room());
    assert_eq!(
        q.head().map(|t| t.label).as_deref(),
        Some("alice"),
        "the service yields to it"
    );
}
