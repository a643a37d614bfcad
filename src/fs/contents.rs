//! Whole-file contents of an already opened file: read (raw or base64-encoded
//! in place for `fs/readFile`) and write, with the protocol's error mapping.

use std::io::{Read as _, Write as _};

use super::error::FsError;

/// Read an opened file for `fs/readFile`, refusing one over `limit` bytes.
pub fn read_whole(mut file: std::fs::File, limit: u64) -> Result<Vec<u8>, FsError> {
    let too_large =
        || FsError::InvalidRequest(format!("file is too large to read: limit is {limit} bytes"));
    let len = file.metadata().map_err(|e| FsError::from_io(&e))?.len();
    if len > limit {
        return Err(too_large());
    }
    let mut data = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    std::io::Read::by_ref(&mut file)
        .take(limit + 1)
        .read_to_end(&mut data)
        .map_err(|e| FsError::from_io(&e))?;
    if data.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(data)
}

/// Bytes read per step while encoding a file (a multiple of 3, so the
/// base64 of the steps concatenates).
const ENCODE_STEP_BYTES: usize = 3 * 256 * 1024;

/// The JSON `result` of `fs/readFile` for an opened file of `len` bytes,
/// base64-encoded as it is read: only one step of raw bytes is ever held
/// besides the result. It starts with [`crate::protocol::jsonrpc::ENVELOPE_GAP`] spaces
/// and has room for one more byte at the end: the response is built in
/// place around it. A file that grew past `len` since it was measured is
/// an error (the reply's bytes were reserved for `len`).
pub fn read_encoded(mut file: std::fs::File, len: u64) -> Result<String, FsError> {
    let gap = crate::protocol::jsonrpc::ENVELOPE_GAP;
    let capacity = usize::try_from(len.div_ceil(3) * 4 + 20)
        .unwrap_or(0)
        .saturating_add(gap + 1);
    let mut out = String::with_capacity(capacity);
    out.extend(std::iter::repeat_n(' ', gap));
    out.push_str(r#"{"dataBase64":""#);
    let mut buf = vec![0u8; ENCODE_STEP_BYTES];
    let mut total = 0u64;
    loop {
        // Fill the step completely (short reads happen) so only the last
        // step's base64 is padded.
        let mut filled = 0;
        while filled < buf.len() {
            match file.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FsError::from_io(&e)),
            }
        }
        total += filled as u64;
        if total > len {
            return Err(FsError::Io(
                "file grew while it was being read; read it again".to_owned(),
            ));
        }
        crate::protocol::base64_into(&buf[..filled], &mut out);
        if filled < buf.len() {
            break;
        }
    }
    out.push_str("\"}");
    Ok(out)
}

/// Write all of `data` to an opened file, mapping errors as `fs/writeFile`.
pub fn write_whole(mut file: &std::fs::File, data: &[u8]) -> Result<(), FsError> {
    file.write_all(data).map_err(|e| FsError::from_io(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_file_encoded_as_read_matches_serde_and_refuses_to_grow() {
        use std::io::Write as _;
        // Longer than one step, and not a multiple of 3.
        let data: Vec<u8> = (0..ENCODE_STEP_BYTES * 2 + 7).map(|i| i as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let len = data.len() as u64;
        let reopen = |f: &std::fs::File| {
            let mut c = f.try_clone().unwrap();
            std::io::Seek::rewind(&mut c).unwrap();
            c
        };
        let expected = serde_json::to_string(&crate::protocol::fs::ReadFileResponse {
            data_base64: crate::protocol::ByteChunk(data),
        })
        .unwrap();
        let encoded = read_encoded(reopen(&f), len).unwrap();
        let gap = crate::protocol::jsonrpc::ENVELOPE_GAP;
        assert_eq!(encoded[..gap], " ".repeat(gap));
        assert_eq!(&encoded[gap..], expected);
        // Room for the response's closing brace without a reallocation.
        assert!(encoded.capacity() > encoded.len());
        // Measured one byte short: the file grew since.
        assert!(read_encoded(reopen(&f), len - 1).is_err());
    }
}
