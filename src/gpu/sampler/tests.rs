//! Unit tests of `sampler`.

use super::*;

#[test]
fn used_memory_is_at_least_what_the_listed_processes_hold() {
    let gpu = |used| GpuInfo {
        index: 0,
        uuid: "GPU-0".into(),
        name: "fake".into(),
        utilization: 0,
        memory_used_mib: used,
        memory_total_mib: 32_607,
        memory_free_mib: 32_607u64.saturating_sub(used),
        temperature: 40,
        power_draw: 20.0,
    };
    let ollama = GpuProcess {
        pid: 7,
        used_memory_mib: 20_000,
        ..GpuProcess::default()
    };
    // A torn sample: the process is listed, the device total does not count it yet.
    let mut gpus = vec![gpu(512)];
    reconcile(&mut gpus, std::slice::from_ref(&ollama));
    assert_eq!(
        (gpus[0].memory_used_mib, gpus[0].memory_free_mib),
        (20_000, 12_607)
    );
    // The driver's reserve stays out of the free figure (an H200 keeps 616 MiB back).
    let mut reserved = gpu(0);
    reserved.memory_free_mib -= 616;
    let mut gpus = vec![reserved];
    reconcile(&mut gpus, std::slice::from_ref(&ollama));
    assert_eq!(gpus[0].memory_free_mib, 32_607 - 616 - 20_000);
    // A driver that says more is used than there is, with a larger listing still (this
    // panicked in debug builds), or free memory past the total.
    let mut odd = gpu(40_000);
    odd.memory_free_mib = u64::MAX;
    let big = GpuProcess {
        used_memory_mib: 45_000,
        ..ollama.clone()
    };
    let mut gpus = vec![odd];
    reconcile(&mut gpus, std::slice::from_ref(&big));
    assert_eq!(gpus[0].memory_used_mib, 40_000);
    assert_eq!(gpus[0].memory_free_mib, 32_607);
    // A device total that already counts it (and more) is left alone.
    let mut gpus = vec![gpu(21_000)];
    reconcile(&mut gpus, std::slice::from_ref(&ollama));
    assert_eq!(gpus[0].memory_used_mib, 21_000);
    // Processes on another GPU do not count.
    let elsewhere = GpuProcess {
        gpu_index: 1,
        ..ollama
    };
    let mut gpus = vec![gpu(512)];
    reconcile(&mut gpus, &[elsewhere]);
    assert_eq!(gpus[0].memory_used_mib, 512);
}
