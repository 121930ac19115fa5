use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

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

impl TryFrom<String> for Sha256Hex {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        if s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Sha256Hex(s))
        } else {
            Err(format!(
                "{s:?} is not a lowercase hex sha256 (64 characters)"
            ))
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

    /// Streams the file once through both hashers.
    pub fn of_file(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_owned(),
            action: "read",
            source,
        };
        let (mut file, _) = crate::fsread::open_regular_file(path)?;
        let mut sha = Sha256::new();
        let mut b3 = blake3::Hasher::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = file.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            sha.update(&buf[..n]);
            b3.update(&buf[..n]);
            size += n as u64;
        }
        Ok(Digests {
            size,
            sha256: Sha256Hex(hex(&sha.finalize())),
            blake3: b3.finalize().to_hex().to_string(),
        })
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
