use std::fmt;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::fsread::Links;

/// A lowercase hex SHA-256, validated on parse.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sha256Hex(String);

impl Sha256Hex {
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Sha256Hex(hex(&Sha256::digest(bytes)))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A string that is not a lowercase hex sha256.
#[derive(Debug, thiserror::Error)]
#[error("{value:?} is not a lowercase hex sha256 (64 characters)")]
pub struct InvalidSha256 {
    pub value: String,
}

impl TryFrom<String> for Sha256Hex {
    type Error = InvalidSha256;
    fn try_from(s: String) -> std::result::Result<Self, InvalidSha256> {
        if s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Sha256Hex(s))
        } else {
            Err(InvalidSha256 { value: s })
        }
    }
}

impl From<Sha256Hex> for String {
    fn from(h: Sha256Hex) -> String {
        h.0
    }
}

impl fmt::Display for Sha256Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Size and both hashes of one artifact. sha256 is what Nix and PyPI speak;
/// blake3 is the fast one consumers may prefer. Both are checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digests {
    pub size: u64,
    pub sha256: Sha256Hex,
    pub blake3: String,
}

impl Digests {
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Digests {
            size: bytes.len() as u64,
            sha256: Sha256Hex::of_bytes(bytes),
            blake3: blake3::hash(bytes).to_hex().to_string(),
        }
    }

    /// Streams the file once through both hashers (following a symbolic
    /// link to a regular file).
    pub fn of_file(path: &Path) -> Result<Self> {
        Self::of_file_with(path, Links::Follow)
    }

    /// [`Digests::of_file`], with links followed or refused.
    pub fn of_file_with(path: &Path, links: Links) -> Result<Self> {
        let (file, _) = crate::fsread::open_regular_file(path, links)?;
        Self::of_reader(file).map_err(|source| Error::Io {
            path: path.to_owned(),
            action: "read",
            source,
        })
    }

    /// Streams `reader` to its end through both hashers, a bounded buffer
    /// at a time.
    pub fn of_reader(mut reader: impl Read) -> std::io::Result<Self> {
        let mut hasher = DigestWriter::default();
        std::io::copy(&mut reader, &mut hasher)?;
        Ok(hasher.finish())
    }

    /// Compares field by field so the error says which property differs.
    pub fn expect_eq(&self, what: &str, actual: &Digests, remedy: &'static str) -> Result<()> {
        if self.size != actual.size {
            return Err(Error::mismatch(
                format!("{what} size"),
                self.size,
                actual.size,
                remedy,
            ));
        }
        if self.sha256 != actual.sha256 {
            return Err(Error::mismatch(
                format!("{what} sha256"),
                &self.sha256,
                &actual.sha256,
                remedy,
            ));
        }
        if self.blake3 != actual.blake3 {
            return Err(Error::mismatch(
                format!("{what} blake3"),
                &self.blake3,
                &actual.blake3,
                remedy,
            ));
        }
        Ok(())
    }
}

/// Size and both hashes of bytes fed in pieces (as `std::io::Write`, so
/// `std::io::copy` can stream a file through it while writing it elsewhere).
#[derive(Default)]
pub struct DigestWriter {
    sha256: Sha256,
    blake3: blake3::Hasher,
    size: u64,
}

impl DigestWriter {
    pub fn update(&mut self, bytes: &[u8]) {
        self.sha256.update(bytes);
        self.blake3.update(bytes);
        self.size += bytes.len() as u64;
    }

    pub fn finish(self) -> Digests {
        Digests {
            size: self.size,
            sha256: Sha256Hex(hex(&self.sha256.finalize())),
            blake3: self.blake3.finalize().to_hex().to_string(),
        }
    }
}

impl Write for DigestWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.update(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_vector() {
        // FIPS 180-2 test vector for "abc".
        assert_eq!(
            Sha256Hex::of_bytes(b"abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn sha256_hex_rejects_bad_strings() {
        assert!(Sha256Hex::try_from("ABC".to_string()).is_err());
        assert!(Sha256Hex::try_from("g".repeat(64)).is_err());
        assert!(Sha256Hex::try_from("A".repeat(64)).is_err());
        assert!(Sha256Hex::try_from("a".repeat(64)).is_ok());
    }

    #[test]
    fn file_and_bytes_digests_agree() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        assert_eq!(Digests::of_file(&p).unwrap(), Digests::of_bytes(&data));
    }
}
