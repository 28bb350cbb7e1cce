//! Resampler bench: gpuhost's streaming polyphase resampler against `rubato` (the ecosystem's
//! resampler: its FFT and its sinc engine), side by side in one run, on the intake paths that
//! matter (8 / 44.1 / 48 kHz → 16 kHz, 60 s of audio fed in 4096-sample blocks as symphonia
//! delivers them). Prints median throughput, the ratio to gpuhost, and two quality numbers: the
//! passband gain of a 1 kHz tone and the alias left of a tone above the new Nyquist.
#![allow(clippy::unwrap_used, unreachable_pub)] // bench code: a panic is the failure report

use std::f64::consts::PI;
use std::time::Instant;

use gpuhost::audio::Resampler;
use rubato::{
    FftFixedIn, SincFixedIn, SincInterpolationParameters, SincInterpolationType, WindowFunction,
};

const TO: u32 = 16_000;
const BLOCK: usize = 4096;
const SECONDS: f64 = 60.0;

fn tone(hz: f64, rate: u32, secs: f64) -> Vec<f32> {
    let n = (f64::from(rate) * secs) as usize;
    (0..n)
        .map(|i| (2.0 * PI * hz * i as f64 / f64::from(rate)).sin() as f32 * 0.5)
        .collect()
}

fn rms(x: &[f32]) -> f64 {
    // Skip the edges, where each engine's delay and padding differ.
    let inner = &x[x.len() / 10..x.len() * 9 / 10];
    (inner
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        / inner.len() as f64)
        .sqrt()
}

#[derive(Clone, Copy, Debug)]
enum Engine {
    Gpuhost,
    RubatoFft,
    RubatoSinc,
}

fn run(engine: Engine, from: u32, input: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(input.len() * TO as usize / from as usize + BLOCK);
    match engine {
        Engine::Gpuhost => {
            let mut r = Resampler::new(from, TO);
            for block in input.chunks(BLOCK) {
                r.push(block, &mut out);
            }
            r.finish(&mut out);
        }
        Engine::RubatoFft => {
            let mut r =
                FftFixedIn::<f32>::new(from as usize, TO as usize, BLOCK, sub_chunks(), 1).unwrap();
            feed(&mut r, input, &mut out);
        }
        Engine::RubatoSinc => {
            let params = SincInterpolationParameters {
                sinc_len: 128,
                f_cutoff: 0.95,
                interpolation: SincInterpolationType::Linear,
                oversampling_factor: 256,
                window: WindowFunction::BlackmanHarris2,
            };
            let ratio = f64::from(TO) / f64::from(from);
            let mut r = SincFixedIn::<f32>::new(ratio, 1.0, params, BLOCK, 1).unwrap();
            feed(&mut r, input, &mut out);
        }
    }
    out
}

fn feed(r: &mut impl rubato::Resampler<f32>, input: &[f32], out: &mut Vec<f32>) {
    let mut chunks = input.chunks_exact(BLOCK);
    for block in &mut chunks {
        out.extend_from_slice(&r.process(&[block], None).unwrap()[0]);
    }
    let rest = chunks.remainder();
    out.extend_from_slice(&r.process_partial(Some(&[rest]), None).unwrap()[0]);
    out.extend_from_slice(&r.process_partial::<&[f32]>(None, None).unwrap()[0]);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("RESAMPLE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    println!("Resampling {SECONDS} s to {TO} Hz in {BLOCK}-sample blocks, median of {rounds} rounds (engines interleaved).\n");
    println!("| from | engine | Msamples/s in | ×gpuhost speed | 1 kHz gain | alias dB |");
    println!("|---|---|---|---|---|---|");
    for from in [8_000u32, 44_100, 48_000] {
        let input = tone(440.0, from, SECONDS);
        let engines = [Engine::Gpuhost, Engine::RubatoFft, Engine::RubatoSinc];
        let mut times = vec![Vec::new(); engines.len()];
        for _ in 0..rounds {
            for (i, &e) in engines.iter().enumerate() {
                let t = Instant::now();
                let out = run(e, from, &input);
                times[i].push(t.elapsed().as_secs_f64());
                std::hint::black_box(out);
            }
        }
        let base = median(times[0].clone());
        for (i, &e) in engines.iter().enumerate() {
            let t = median(times[i].clone());
            let gain = rms(&run(e, from, &tone(1000.0, from, 8.0))) / rms(&tone(1000.0, from, 8.0));
            // A tone at 0.6 × the source Nyquist above the target's (only when downsampling).
            let alias = if from > TO {
                let hz = f64::from(TO) / 2.0 + 0.6 * (f64::from(from) - f64::from(TO)) / 2.0;
                let out = run(e, from, &tone(hz, from, 8.0));
                format!(
                    "{:.1}",
                    20.0 * (rms(&out) / rms(&tone(hz, from, 8.0))).log10()
                )
            } else {
                "n/a (upsampling)".into()
            };
            println!(
                "| {from} | {e:?} | {:.1} | {:.2} | {gain:.4} | {alias} |",
                input.len() as f64 / t / 1e6,
                base / t,
            );
        }
    }
}

/// `RESAMPLE_SUB_CHUNKS` (default 8, rubato's best at 48 kHz here): rubato's FFT size is the block over this.
fn sub_chunks() -> usize {
    std::env::var("RESAMPLE_SUB_CHUNKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}
