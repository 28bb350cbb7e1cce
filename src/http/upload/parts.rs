//! What a multipart body may hold outside its fields' data: the preamble before the first
//! boundary and each part's header block are bounded, checked as the bytes stream in.
//!
//! The multipart parser looks for the end of a part's headers by searching everything buffered
//! so far, again at each new chunk: a header block that never ends is held whole and searched
//! quadratically (64 MB took 22 s of a runtime thread). Here each byte is looked at once.

use memchr::memmem;

/// The most a part's header block (or the preamble) may take; real ones are a few hundred bytes.
pub(super) const MAX_PART_HEADERS: usize = 16 * 1024;

/// Where the scan is: outside any part, inside a header block, or in a part's data. The count
/// is the bytes seen so far of the preamble or of the header block.
enum Scan {
    Preamble(usize),
    Headers(usize),
    Data,
}

pub(super) struct PartScan {
    /// `\r\n--boundary`: what starts every part (the body is scanned as if it began with `\r\n`).
    delimiter: Vec<u8>,
    scan: Scan,
    /// The end of the previous chunk, where a delimiter or `\r\n\r\n` may have begun.
    carry: Vec<u8>,
}

impl PartScan {
    pub(super) fn new(boundary: &str) -> PartScan {
        PartScan {
            delimiter: [b"\r\n--", boundary.as_bytes()].concat(),
            scan: Scan::Preamble(0),
            carry: b"\r\n".to_vec(),
        }
    }

    /// Looks at the next chunk; the error names what grew past its bound.
    pub(super) fn feed(&mut self, chunk: &[u8]) -> Result<(), &'static str> {
        let carried = self.carry.len();
        let buf = [std::mem::take(&mut self.carry).as_slice(), chunk].concat();
        // Bytes of this chunk from `from` on (the carried ones were counted before).
        let fresh = |from: usize| buf.len() - from.max(carried);
        let mut at = 0;
        loop {
            match self.scan {
                Scan::Preamble(_) | Scan::Data => {
                    if let Some(p) = memmem::find(&buf[at..], &self.delimiter) {
                        at += p + self.delimiter.len();
                        self.scan = Scan::Headers(0);
                        continue;
                    }
                    if let Scan::Preamble(seen) = self.scan {
                        let seen = seen + fresh(at);
                        if seen > MAX_PART_HEADERS {
                            return Err("the form has more than 16 KiB before its first part: is the Content-Type's boundary the one the body uses?");
                        }
                        self.scan = Scan::Preamble(seen);
                    }
                    self.keep(&buf[at..], self.delimiter.len() - 1);
                }
                Scan::Headers(seen) => {
                    if let Some(p) = memmem::find(&buf[at..], b"\r\n\r\n") {
                        at += p + 4;
                        self.scan = Scan::Data;
                        continue;
                    }
                    let seen = seen + fresh(at);
                    if seen > MAX_PART_HEADERS {
                        return Err("a part of the form has more than 16 KiB of headers");
                    }
                    self.scan = Scan::Headers(seen);
                    self.keep(&buf[at..], 3);
                }
            }
            return Ok(());
        }
    }

    /// Carries the last `n` bytes of `rest` into the next chunk.
    fn keep(&mut self, rest: &[u8], n: usize) {
        self.carry = rest[rest.len().saturating_sub(n)..].to_vec();
    }
}

/// The `boundary` parameter of a multipart/form-data content type.
pub(super) fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|param| {
        let (key, value) = param.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> Result<(), &'static str> {
        let mut s = PartScan::new("XX");
        chunks.iter().try_for_each(|c| s.feed(c))
    }

    #[test]
    fn a_form_passes_whole_or_byte_by_byte() {
        let form = b"--XX\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nvalue\r\n--XX\r\nContent-Disposition: form-data; name=\"f\"; filename=\"x\"\r\n\r\n\x00\x01data\r\n--XX--\r\n";
        assert_eq!(scan(&[form]), Ok(()));
        let bytes: Vec<&[u8]> = form.chunks(1).collect();
        assert_eq!(scan(&bytes), Ok(()));
        // Data of any size between the headers: only the header blocks are bounded.
        let big = vec![b'a'; 5 * MAX_PART_HEADERS];
        let body = [&form[..52], &big[..], &form[52..]].concat();
        assert_eq!(scan(&[&body]), Ok(()));
    }

    #[test]
    fn headers_that_never_end_are_refused_however_they_arrive() {
        let head = b"--XX\r\nContent-Disposition: form-data; name=\"x\"; filename=\"".to_vec();
        let endless = [head, vec![b'a'; MAX_PART_HEADERS]].concat();
        assert!(scan(&[&endless]).unwrap_err().contains("headers"));
        let bytes: Vec<&[u8]> = endless.chunks(7).collect();
        assert!(scan(&bytes).unwrap_err().contains("headers"));
        let preamble = vec![b'a'; MAX_PART_HEADERS + 1];
        assert!(scan(&[&preamble])
            .unwrap_err()
            .contains("before its first part"));
    }

    #[test]
    fn the_boundary_is_read_from_the_content_type() {
        let b = |ct| boundary(ct);
        assert_eq!(b("multipart/form-data; boundary=XX").as_deref(), Some("XX"));
        assert_eq!(
            b("Multipart/Form-Data; charset=utf-8; BOUNDARY=\"a b\"").as_deref(),
            Some("a b")
        );
        assert_eq!(b("multipart/form-data; boundary="), None);
        assert_eq!(b("application/json; boundary=XX"), None);
    }
}
