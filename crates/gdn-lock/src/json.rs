//! A pass over a JSON document that refuses any object naming a key twice,
//! at any depth. serde_json keeps one of the values of a repeated map key
//! without a word (and serde's `flatten` does the same for struct fields), so
//! the document a reviewer reads could differ from the one enforced.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Refuses `bytes` if any JSON object in it has a repeated key; the error
/// names the key and where it is (a path like `sources` or
/// `device_artifacts."cubin/x.cubin"`), and serde_json adds line and column.
pub(crate) fn reject_duplicate_keys(bytes: &[u8]) -> serde_json::Result<()> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    UniqueKeys { at: String::new() }.deserialize(&mut de)?;
    de.end()
}

/// Walks one JSON value; `at` is where it sits in the document.
struct UniqueKeys {
    at: String,
}

impl UniqueKeys {
    fn child(&self, name: &str) -> UniqueKeys {
        let plain =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        let name = if plain {
            name.to_string()
        } else {
            format!("{name:?}")
        };
        UniqueKeys {
            at: if self.at.is_empty() {
                name
            } else {
                format!("{}.{name}", self.at)
            },
        }
    }
}

impl<'de> DeserializeSeed<'de> for UniqueKeys {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = BTreeSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let child = self.child(&key);
            if !seen.insert(key) {
                return Err(de::Error::custom(format!(
                    "duplicate key {} (a JSON object may name each key once)",
                    child.at
                )));
            }
            map.next_value_seed(child)?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        while seq
            .next_element_seed(UniqueKeys {
                at: format!("{}[{i}]", self.at),
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::reject_duplicate_keys;

    #[test]
    fn repeated_keys_are_found_at_any_depth_and_named() {
        reject_duplicate_keys(br#"{"a": {"b": 1, "c": [1, {"d": 2}]}, "e": null}"#).unwrap();
        for (doc, at) in [
            (&br#"{"a": 1, "a": 1}"#[..], "duplicate key a "),
            (
                br#"{"m": {"x/y": 1, "x/y": 2}}"#,
                r#"duplicate key m."x/y""#,
            ),
            (br#"{"l": [{}, {"k": 1, "k": 1}]}"#, "duplicate key l[1].k"),
        ] {
            let err = reject_duplicate_keys(doc).unwrap_err().to_string();
            assert!(err.contains(at), "{err}");
        }
        // Same key in different objects is fine.
        reject_duplicate_keys(br#"{"a": {"k": 1}, "b": {"k": 1}}"#).unwrap();
    }
}
