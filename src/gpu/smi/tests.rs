//! nvidia-smi's CSV read: GPUs, processes, missing and odd values, lines not understood.

use super::*;

#[test]
fn parses_gpus_and_apps_with_missing_values() {
    let sample = parse_gpus(
        "0, GPU-aaa, NVIDIA GeForce RTX 5090, 37, 20480, 32607, 61, 312.40\n1, GPU-bbb, NVIDIA H200, [N/A], 0, 143771, 30, [Not Supported], 143155\n",
    )
    .unwrap();
    let gpus = &sample.gpus;
    assert_eq!(gpus.len(), 2);
    // Without `memory.free` (older drivers, other tools): total − used.
    assert_eq!(gpus[0].memory_free_mib, 32607 - 20480);
    // With it: the driver's figure, reserved memory taken out (as seen on an H200).
    assert_eq!(gpus[1].memory_free_mib, 143155);
    assert_eq!(gpus[1].utilization, 0);
    assert_eq!(gpus[1].power_draw, 0.0);
    let apps = parse_apps(
        "4242, python, 14000, GPU-bbb\n77, vllm, [N/A], GPU-aaa\n",
        &sample,
    )
    .unwrap();
    assert_eq!(apps[0].gpu_index, 1);
    assert_eq!(apps[1].used_memory_mib, None);
    // A name with commas in it: the memory and the GPU are still its own.
    let apps = parse_apps("4242, /opt/a,b/python, 140, GPU-bbb\n", &sample).unwrap();
    assert_eq!(
        (
            apps[0].name.as_deref(),
            apps[0].used_memory_mib,
            apps[0].gpu_index
        ),
        (Some("/opt/a,b/python"), Some(140), 1)
    );
    // A GPU the listing does not have, among several: not counted on GPU 0 (which then
    // read busy, and the GPU it held idle); the sample fails.
    for odd in ["MIG-1111", "[N/A]", ""] {
        let line = format!("4242, python, 140, {odd}\n");
        let err = parse_apps(&line, &sample).unwrap_err().to_string();
        assert!(err.contains("not known"), "{odd}: {err}");
    }
    // With one GPU, it is that one.
    let one = RawSample {
        gpus: gpus[1..].to_vec(),
        ..RawSample::default()
    };
    let apps = parse_apps("4242, python, 140, [N/A]\n", &one).unwrap();
    assert_eq!(apps[0].gpu_index, 1);
    assert!(parse_gpus("garbage\n").is_err());
    assert!(parse_gpus("").is_err());
    // Not a number JSON can carry: absent, as [N/A] is.
    let odd = parse_gpus("0, GPU-aaa, NVIDIA H200, 0, 100, 143771, 30, NaN, 143000\n").unwrap();
    assert_eq!(odd.gpus[0].power_draw, 0.0);
    let odd = parse_gpus("0, GPU-aaa, NVIDIA H200, 0, 100, 143771, 30, -inf\n").unwrap();
    assert_eq!(odd.gpus[0].power_draw, 0.0);
    // A field too many (a decimal comma) is not read shifted.
    let err = parse_gpus("0, GPU-aaa, NVIDIA H200, 0, 100, 143771, 30, 70,50, 143000\n");
    assert!(err.is_err(), "{err:?}");
}

#[test]
fn a_gpu_without_memory_figures_is_known_but_unmeasured() {
    // GB10 (unified memory) reports no memory figures: not an idle GPU with 0 MiB (the
    // sampler fails the sample when it is the configured device), but a GPU its processes
    // are on.
    let sample = parse_gpus(
        "0, GPU-aaaa, NVIDIA H200, 0, 10, 143771, 30, 70.0\n1, GPU-bbbb, NVIDIA GB10, [N/A], [N/A], [N/A], 45, [N/A], [N/A]\n",
    )
    .unwrap();
    assert_eq!(sample.gpus.len(), 1);
    assert_eq!(
        (
            sample.unmeasured[0].index,
            sample.unmeasured[0].uuid.as_str()
        ),
        (1, "GPU-bbbb")
    );
    assert!(
        sample.unmeasured[0].why.contains("no memory figures"),
        "{:?}",
        sample.unmeasured
    );
    let apps = parse_apps("4242, python, 140, GPU-bbbb\n", &sample).unwrap();
    assert_eq!(apps[0].gpu_index, 1);
    let only =
        parse_gpus("0, GPU-aaaa, NVIDIA GB10, [N/A], [N/A], [N/A], 45, [N/A], [N/A]\n").unwrap();
    assert!(only.gpus.is_empty() && only.unmeasured.len() == 1);
    // One GPU in all: a process with an odd UUID is on it, measured or not.
    let apps = parse_apps("4242, python, 140, [N/A]\n", &only).unwrap();
    assert_eq!(apps[0].gpu_index, 0);
}

#[test]
fn a_process_list_that_is_not_one_fails() {
    let gpus = parse_gpus("0, GPU-aaa, NVIDIA H200, 0, 10, 143771, 30, 70.0\n").unwrap();
    assert!(parse_apps("xxxxxxxx\n", &gpus).is_err());
    assert!(parse_apps("No running processes found\n", &gpus)
        .unwrap()
        .is_empty());
    assert!(parse_apps("", &gpus).unwrap().is_empty());
}
