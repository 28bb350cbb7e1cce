//! A streaming polyphase windowed-sinc resampler (mono f32): constant memory for any input
//! length. Integer rates have a rational ratio L/M, so the kernel is precomputed for each of the
//! L output phases and every output sample is one dot product. Kept instead of `rubato` because
//! it is faster on 48 kHz uploads at inaudible aliasing (`cargo bench --bench resample`,
//! docs/benchmarks.md).

use std::f64::consts::PI;

/// Zero crossings of the sinc kept on each side of the centre, at the lower of the two rates.
const ZERO_CROSSINGS: f64 = 16.0;
/// Most kernel phases precomputed. Common rates need at most 640 (11.025 kHz); an unusual rate
/// whose exact ratio needs more uses this many, rounding each output's position down to the
/// nearest 1/2048 of an input sample (far below audibility), so memory stays a few MB.
const MAX_PHASES: u64 = 2048;

pub struct Resampler {
    /// Output phases (L) and input step (M): output n sits at input position n·M/L.
    up: u64,
    down: u64,
    /// Kernel phases in `bank`: `up`, or `MAX_PHASES` when `up` is larger.
    phases: u64,
    /// Half width of the kernel, in input samples; each phase has `2 * half` taps.
    half: i64,
    /// `up` rows of `2 * half` coefficients, for input offsets `-half + 1 ..= half`.
    bank: Vec<f32>,
    buf: Vec<f32>,
    /// Absolute input index of `buf[0]`.
    buf_start: i64,
    /// Index of the next output sample.
    next_out: u64,
    /// Input samples seen so far.
    seen: i64,
    /// Same rate in and out: copy.
    passthrough: bool,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Resampler {
    pub fn new(from_hz: u32, to_hz: u32) -> Resampler {
        let (from, to) = (u64::from(from_hz.max(1)), u64::from(to_hz.max(1)));
        let g = gcd(from, to);
        let (up, down) = (to / g, from / g);
        let cutoff = (to as f64 / from as f64).min(1.0) * 0.97;
        let half = (ZERO_CROSSINGS / cutoff).ceil() as i64;
        let taps = 2 * half as usize;
        let phases = up.min(MAX_PHASES);
        let mut bank = Vec::with_capacity(phases as usize * taps);
        for p in 0..phases {
            let frac = p as f64 / phases as f64;
            for j in (-half + 1)..=half {
                bank.push(kernel(frac - j as f64, cutoff, half) as f32);
            }
        }
        Resampler {
            up,
            down,
            phases,
            half,
            bank,
            buf: Vec::new(),
            buf_start: 0,
            next_out: 0,
            seen: 0,
            passthrough: from == to,
        }
    }

    /// Adds input and appends every output sample that is now fully determined.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        if self.passthrough {
            out.extend_from_slice(input);
            return;
        }
        self.buf.extend_from_slice(input);
        self.seen += input.len() as i64;
        self.drain(out, self.seen);
    }

    /// Flushes the tail (as if followed by silence); the output has `ceil(n * L / M)` samples.
    pub fn finish(&mut self, out: &mut Vec<f32>) {
        if self.passthrough {
            return;
        }
        let total_out = (self.seen as u64 * self.up).div_ceil(self.down);
        let pad = vec![0.0; (self.half + 1) as usize];
        self.buf.extend_from_slice(&pad);
        let available = self.seen + pad.len() as i64;
        self.drain(out, available);
        out.truncate(out.len() - (self.next_out.saturating_sub(total_out)) as usize);
        self.next_out = self.next_out.min(total_out);
    }

    fn drain(&mut self, out: &mut Vec<f32>, available: i64) {
        let taps = 2 * self.half as usize;
        loop {
            let pos = self.next_out * self.down;
            let centre = (pos / self.up) as i64;
            if centre + self.half >= available {
                break;
            }
            let phase = (pos % self.up) * self.phases / self.up;
            let row = &self.bank[phase as usize * taps..][..taps];
            let first = centre - self.half + 1;
            let value = if first >= self.buf_start {
                let start = (first - self.buf_start) as usize;
                dot(&self.buf[start..start + taps], row)
            } else {
                // The first outputs reach before the start: those inputs are silence.
                (0..taps)
                    .filter(|&j| first + j as i64 >= self.buf_start)
                    .map(|j| self.buf[(first + j as i64 - self.buf_start) as usize] * row[j])
                    .sum()
            };
            out.push(value);
            self.next_out += 1;
        }
        let next_centre = (self.next_out * self.down / self.up) as i64;
        let keep_from = (next_centre - self.half + 1).max(self.buf_start);
        let drop_n = ((keep_from - self.buf_start) as usize).min(self.buf.len());
        if drop_n > 0 {
            self.buf.drain(..drop_n);
            self.buf_start += drop_n as i64;
        }
    }
}

/// A dot product with independent accumulators, so the compiler can vectorize it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Hann-windowed sinc low-pass at `cutoff` (relative to the input Nyquist), `half` samples wide.
fn kernel(d: f64, cutoff: f64, half: i64) -> f64 {
    let x = d * cutoff;
    let sinc = if x.abs() < 1e-12 {
        1.0
    } else {
        (PI * x).sin() / (PI * x)
    };
    let w = d / half as f64;
    let window = if w.abs() >= 1.0 {
        0.0
    } else {
        0.5 + 0.5 * (PI * w).cos()
    };
    cutoff * sinc * window
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(hz: f64, rate: u32, secs: f64) -> Vec<f32> {
        let n = (f64::from(rate) * secs) as usize;
        (0..n)
            .map(|i| (2.0 * PI * hz * i as f64 / f64::from(rate)).sin() as f32 * 0.5)
            .collect()
    }

    fn resample_all(input: &[f32], from: u32, to: u32, chunk: usize) -> Vec<f32> {
        let mut r = Resampler::new(from, to);
        let mut out = Vec::new();
        for c in input.chunks(chunk) {
            r.push(c, &mut out);
        }
        r.finish(&mut out);
        out
    }

    #[test]
    fn keeps_length_and_tone() {
        for (from, chunk) in [(44_100, 1000), (48_000, 4096), (8_000, 7), (22_050, 333)] {
            let input = tone(440.0, from, 1.0);
            let out = resample_all(&input, from, 16_000, chunk);
            assert_eq!(out.len(), 16_000, "from {from}");
            // Compare against the ideal tone away from the edges.
            let ideal = tone(440.0, 16_000, 1.0);
            let err: f32 = out[800..15_200]
                .iter()
                .zip(&ideal[800..15_200])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 0.02, "from {from}: max error {err}");
        }
    }

    #[test]
    fn unusual_rates_stay_small_and_accurate() {
        // 22 254 Hz (old Macintosh audio) has an exact ratio of 8000/11127: phases are capped.
        let r = Resampler::new(22_254, 16_000);
        assert!(r.bank.len() <= (MAX_PHASES as usize) * 2 * r.half as usize);
        let input = tone(440.0, 22_254, 1.0);
        let out = resample_all(&input, 22_254, 16_000, 1024);
        assert_eq!(out.len(), 16_000);
        let ideal = tone(440.0, 16_000, 1.0);
        let err: f32 = out[800..15_200]
            .iter()
            .zip(&ideal[800..15_200])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 0.02, "max error {err}");
    }

    #[test]
    fn removes_what_cannot_be_represented() {
        // 7 kHz survives 16 kHz output, 10 kHz at 48 kHz must be filtered away.
        let out = resample_all(&tone(10_000.0, 48_000, 0.5), 48_000, 16_000, 512);
        let rms = (out[400..7_600].iter().map(|x| x * x).sum::<f32>() / 7_200.0).sqrt();
        assert!(rms < 0.01, "aliased energy {rms}");
    }
}
