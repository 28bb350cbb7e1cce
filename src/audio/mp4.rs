//! An MP4/M4A audio track's encoder delay, read from its edit list (`moov/trak/edts/elst`):
//! AAC encoders put 1024 (ffmpeg) to 2112 (Apple) samples of priming before the audio, and
//! symphonia 0.5 does not read the edit list that says so, so every time came that much late.

use std::io::{Read, Seek, SeekFrom};

/// The most of `moov` read into memory: its sample tables grow with the file's length (a few
/// MB for hours of audio); a box that claims more is not believed.
const MOOV_MAX: u64 = 64 << 20;

/// Seconds the first audio track's edit list skips at its start (its priming), if the input is
/// an MP4 with one; `None` for anything else, a damaged box tree, or no skip.
pub(super) fn priming_seconds(input: &mut (impl Read + Seek)) -> Option<f64> {
    let moov = read_moov(input)?;
    let priming = children(&moov)
        .filter(|(kind, _)| kind == b"trak")
        .find_map(|(_, trak)| audio_priming(trak));
    priming
}

/// The `moov` box's body, found among the top-level boxes (before or after `mdat`).
fn read_moov(input: &mut (impl Read + Seek)) -> Option<Vec<u8>> {
    let mut at = 0u64;
    let mut first = true;
    loop {
        input.seek(SeekFrom::Start(at)).ok()?;
        let mut head = [0u8; 8];
        input.read_exact(&mut head).ok()?;
        let kind: [u8; 4] = head[4..8].try_into().ok()?;
        // An MP4 opens with `ftyp` (or, in old QuickTime files, `moov`/`mdat`/`wide`/`free`).
        if first
            && !matches!(
                &kind,
                b"ftyp" | b"moov" | b"mdat" | b"wide" | b"free" | b"skip"
            )
        {
            return None;
        }
        first = false;
        let (size, header) = match u32::from_be_bytes(head[0..4].try_into().ok()?) {
            1 => {
                let mut large = [0u8; 8];
                input.read_exact(&mut large).ok()?;
                (u64::from_be_bytes(large), 16)
            }
            0 => return None, // runs to the end of the file: `mdat` last, no `moov` after it
            n => (u64::from(n), 8),
        };
        if size < header {
            return None;
        }
        if &kind == b"moov" {
            let body = size - header;
            if body > MOOV_MAX {
                return None;
            }
            let mut moov = Vec::new();
            input.take(body).read_to_end(&mut moov).ok()?;
            return (moov.len() as u64 == body).then_some(moov);
        }
        at = at.checked_add(size)?;
    }
}

/// The boxes in `body`: (type, body) pairs, stopping at the first that does not fit.
fn children(body: &[u8]) -> impl Iterator<Item = ([u8; 4], &[u8])> {
    let mut rest = body;
    std::iter::from_fn(move || {
        let size = u32::from_be_bytes(rest.get(0..4)?.try_into().ok()?) as usize;
        let kind: [u8; 4] = rest.get(4..8)?.try_into().ok()?;
        let (header, size) = match size {
            1 => (
                16,
                usize::try_from(u64::from_be_bytes(rest.get(8..16)?.try_into().ok()?)).ok()?,
            ),
            0 => (8, rest.len()),
            n => (8, n),
        };
        let inner = rest.get(header..size)?;
        rest = &rest[size..];
        Some((kind, inner))
    })
}

fn child<'a>(body: &'a [u8], kind: &[u8; 4]) -> Option<&'a [u8]> {
    children(body).find(|(k, _)| k == kind).map(|(_, b)| b)
}

fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A `trak`'s priming in seconds, when it is a sound track whose edit list starts its
/// presentation past its first sample.
fn audio_priming(trak: &[u8]) -> Option<f64> {
    let mdia = child(trak, b"mdia")?;
    // hdlr: version/flags, pre_defined, handler type.
    if child(mdia, b"hdlr")?.get(8..12)? != b"soun" {
        return None;
    }
    let mdhd = child(mdia, b"mdhd")?;
    // mdhd: version/flags, then creation and modification times (4 or 8 bytes each), timescale.
    let timescale = match mdhd.first()? {
        0 => be_u32(mdhd, 12)?,
        1 => be_u32(mdhd, 20)?,
        _ => return None,
    };
    let elst = child(child(trak, b"edts")?, b"elst")?;
    let version = *elst.first()?;
    let entries = be_u32(elst, 4)? as usize;
    let entry_len = if version == 1 { 20 } else { 12 };
    // The first edit that shows media (an empty edit, media time -1, only delays the track).
    let media_time = (0..entries).find_map(|i| {
        let at = 8 + i * entry_len;
        let time = if version == 1 {
            be_u64(elst, at + 8)? as i64
        } else {
            i64::from(be_u32(elst, at + 4)? as i32)
        };
        (time != -1).then_some(time)
    })?;
    (timescale > 0 && media_time > 0).then(|| media_time as f64 / f64::from(timescale))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxed(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut b = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        b.extend_from_slice(kind);
        b.extend_from_slice(body);
        b
    }

    fn track(handler: &[u8; 4], media_time: i32) -> Vec<u8> {
        let hdlr = [&[0u8; 8][..], handler, &[0u8; 12]].concat();
        let mdhd = [&[0u8; 12][..], &48_000u32.to_be_bytes(), &[0u8; 8]].concat();
        let mdia = [boxed(b"hdlr", &hdlr), boxed(b"mdhd", &mdhd)].concat();
        // An empty edit first (ignored), then the one that skips the priming.
        let elst = [
            &[0u8; 4][..],
            &2u32.to_be_bytes(),
            &100u32.to_be_bytes(),
            &(-1i32).to_be_bytes(),
            &0x10000u32.to_be_bytes(),
            &48_000u32.to_be_bytes(),
            &media_time.to_be_bytes(),
            &0x10000u32.to_be_bytes(),
        ]
        .concat();
        let edts = boxed(b"edts", &boxed(b"elst", &elst));
        boxed(b"trak", &[boxed(b"mdia", &mdia), edts].concat())
    }

    #[test]
    fn the_sound_tracks_edit_list_gives_the_priming_wherever_moov_is() {
        let moov = boxed(
            b"moov",
            &[track(b"vide", 512), track(b"soun", 2112)].concat(),
        );
        let ftyp = boxed(b"ftyp", b"M4A \0\0\0\0");
        let mdat = boxed(b"mdat", &[7u8; 1000]);
        for file in [
            [ftyp.clone(), moov.clone(), mdat.clone()].concat(),
            [ftyp.clone(), mdat.clone(), moov.clone()].concat(),
        ] {
            let got = priming_seconds(&mut std::io::Cursor::new(file));
            assert_eq!(got, Some(2112.0 / 48_000.0));
        }
        // Not an MP4, a truncated one, no skip: nothing to drop.
        let none = |b: Vec<u8>| priming_seconds(&mut std::io::Cursor::new(b));
        assert_eq!(none(b"RIFF\0\0\0\0WAVEfmt ".to_vec()), None);
        assert_eq!(none([ftyp.clone(), moov[..40].to_vec()].concat()), None);
        let plain = boxed(b"moov", &track(b"soun", 0));
        assert_eq!(none([ftyp, plain].concat()), None);
    }
}
