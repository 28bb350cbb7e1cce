//! A streaming windowed-sinc resampler (mono f32): constant memory for any input length.

use std::f64::consts::PI;

/// Zero crossings of the sinc kept on each side of the centre, at the lower of the two rates.
const ZERO_CROSSINGS: f64 = 16.0;
/// Kernel table entries per input sample of distance (linear interpolation between them).
const TABLE_STEPS: f64 = 512.0;

pub struct Resampler {
    /// Input samples per output sample.
    step: f64,
    /// Half width of the kernel, in input samples.
    half: i64,
    buf: Vec<f32>,
    /// Absolute input index of `buf[0]`.
    buf_start: i64,
    /// Index of the next output sample.
    next_out: u64,
    /// Input samples seen so far.
    seen: i64,
    /// The windowed-sinc kernel sampled at `1 / TABLE_STEPS` steps of distance, from 0 to `half`.
    table: Vec<f64>,
    /// Same rate in and out: copy.
    passthrough: bool,
}

impl Resampler {
    pub fn new(from_hz: u32, to_hz: u32) -> Resampler {
        let step = f64::from(from_hz) / f64::from(to_hz);
        let cutoff = (1.0 / step).min(1.0) * 0.97;
        let half = (ZERO_CROSSINGS / cutoff).ceil() as i64;
        let entries = (half as f64 * TABLE_STEPS) as usize + 2;
        let table = (0..entries)
            .map(|i| kernel(i as f64 / TABLE_STEPS, cutoff, half))
            .collect();
        Resampler {
            step,
            half,
            buf: Vec::new(),
            buf_start: 0,
            next_out: 0,
            seen: 0,
            table,
            passthrough: from_hz == to_hz,
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

    /// Flushes the tail (as if followed by silence); the output has `ceil(n / step)` samples.
    pub fn finish(&mut self, out: &mut Vec<f32>) {
        if self.passthrough {
            return;
        }
        let total_out = (self.seen as f64 / self.step).ceil() as u64;
        let pad = vec![0.0; (self.half + 1) as usize];
        self.buf.extend_from_slice(&pad);
        let available = self.seen + pad.len() as i64;
        self.drain(out, available);
        out.truncate(out.len() - (self.next_out.saturating_sub(total_out)) as usize);
        self.next_out = self.next_out.min(total_out);
    }

    fn drain(&mut self, out: &mut Vec<f32>, available: i64) {
        loop {
            let t = self.next_out as f64 * self.step;
            let centre = t.floor() as i64;
            if centre + self.half >= available {
                break;
            }
            let mut acc = 0.0f64;
            for i in (centre - self.half + 1)..=(centre + self.half) {
                let x = i - self.buf_start;
                if x < 0 || i < 0 {
                    continue;
                }
                let d = t - i as f64;
                acc += f64::from(self.buf[x as usize]) * self.lookup(d);
            }
            out.push(acc as f32);
            self.next_out += 1;
        }
        let keep_from =
            ((self.next_out as f64 * self.step).floor() as i64 - self.half).max(self.buf_start);
        let drop_n = (keep_from - self.buf_start) as usize;
        if drop_n > 0 {
            self.buf.drain(..drop_n.min(self.buf.len()));
            self.buf_start += drop_n as i64;
        }
    }

    /// The kernel at distance `d`, interpolated from the table.
    fn lookup(&self, d: f64) -> f64 {
        let pos = d.abs() * TABLE_STEPS;
        let i = pos as usize;
        if i + 1 >= self.table.len() {
            return 0.0;
        }
        let frac = pos - i as f64;
        self.table[i] + (self.table[i + 1] - self.table[i]) * frac
    }
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
    fn removes_what_cannot_be_represented() {
        // 7 kHz survives 16 kHz output, 10 kHz at 48 kHz must be filtered away.
        let out = resample_all(&tone(10_000.0, 48_000, 0.5), 48_000, 16_000, 512);
        let rms = (out[400..7_600].iter().map(|x| x * x).sum::<f32>() / 7_200.0).sqrt();
        assert!(rms < 0.01, "aliased energy {rms}");
    }
}
