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
