//! Checks of a Parquet footer before the parquet crate acts on it.
//!
//! The parquet crate (59) returns errors for most damaged files, but a few
//! footer values reach a `panic!`, `unwrap` or `assert!` in it or in
//! arrow-ipc instead. Each is found here first and refused as bad input;
//! `fuzz/fuzz_targets/read_embeddings.rs` is how they were found, and
//! `tests/fuzz_regressions.rs` keeps them refused. On an arrow or parquet
//! upgrade, rerun the fuzz target: the checks mirror those crates' code.

use arrow::ipc;
use parquet::file::metadata::ParquetMetaData;

/// The footer key of the Arrow schema a writer embeds (base64 IPC).
const ARROW_SCHEMA_KEY: &str = "ARROW:schema";

/// What is wrong with `metadata`, if it holds a value the parquet crate
/// would panic on.
pub(super) fn check(metadata: &ParquetMetaData) -> Result<(), String> {
    let file = metadata.file_metadata();
    if file.num_rows() < 0 {
        return Err(format!("the footer gives {} rows", file.num_rows()));
    }
    for (g, group) in metadata.row_groups().iter().enumerate() {
        if group.num_rows() < 0 {
            return Err(format!("row group {g} has {} rows", group.num_rows()));
        }
        for column in group.columns() {
            // `ColumnChunkMetaData::byte_range` asserts both are non-negative.
            let start = column
                .dictionary_page_offset()
                .unwrap_or(column.data_page_offset());
            if start < 0 || column.compressed_size() < 0 {
                return Err(format!(
                    "column chunk '{}' of row group {g} starts at byte {start} and is {} bytes long",
                    column.column_path(),
                    column.compressed_size()
                ));
            }
        }
    }
    // The parquet crate converts the last value of the key; check them all.
    for entry in file.key_value_metadata().into_iter().flatten() {
        if let (ARROW_SCHEMA_KEY, Some(value)) = (entry.key.as_str(), &entry.value) {
            check_arrow_schema(value)
                .map_err(|why| format!("its embedded Arrow schema ({ARROW_SCHEMA_KEY}) {why}"))?;
        }
    }
    Ok(())
}

/// The embedded Arrow schema, decoded as the parquet crate decodes it
/// (`get_arrow_schema_from_metadata`): what arrow-ipc's `fb_to_schema`
/// would panic on. Values that do not decode or verify are left to the
/// parquet crate, which refuses them with an error.
fn check_arrow_schema(encoded: &str) -> Result<(), String> {
    let Some(bytes) = decode_base64(encoded) else {
        return Ok(());
    };
    let slice = if bytes.len() > 8 && bytes[0..4] == [255u8; 4] {
        &bytes[8..]
    } else {
        &bytes[..]
    };
    let Ok(message) = ipc::root_as_message(slice) else {
        return Ok(());
    };
    let Some(schema) = message.header_as_schema() else {
        return Ok(());
    };
    let fields = schema.fields().ok_or("has no field list")?;
    for field in fields {
        if field.type_type() == ipc::Type::Decimal && schema.endianness() == ipc::Endianness::Big {
            return Err("has a big-endian decimal field".into());
        }
        check_field(field)?;
    }
    Ok(())
}

/// arrow-ipc's `get_data_type` for one field and its children: an error
/// where that function panics.
fn check_field(field: ipc::Field<'_>) -> Result<(), String> {
    use ipc::Type;
    let name = field.name().unwrap_or_default();
    let t = field.type_type();
    let bad = |why: String| Err(format!("has a malformed field '{name}' ({t:?}): {why}"));
    let missing = || format!("has a malformed field '{name}' ({t:?}): no type parameters");
    if let Some(dictionary) = field.dictionary() {
        match dictionary.indexType() {
            Some(int) if matches!(int.bitWidth(), 8 | 16 | 32 | 64) => {}
            Some(int) => return bad(format!("dictionary index of {} bits", int.bitWidth())),
            None => return bad("dictionary without an index type".into()),
        }
    }
    let children = field.children();
    let count = children.map_or(0, |c| c.len());
    let needs_children = |n: usize| {
        if children.is_some() && count == n {
            Ok(())
        } else {
            Err(format!(
                "has a malformed field '{name}' ({t:?}): {count} children, expected {n}"
            ))
        }
    };
    match t {
        Type::Null
        | Type::Bool
        | Type::Binary
        | Type::BinaryView
        | Type::LargeBinary
        | Type::Utf8
        | Type::Utf8View
        | Type::LargeUtf8 => return Ok(()),
        Type::Int => {
            let int = field.type_as_int().ok_or_else(missing)?;
            if !matches!(int.bitWidth(), 8 | 16 | 32 | 64) {
                return bad(format!("{} bits", int.bitWidth()));
            }
            return Ok(());
        }
        Type::FixedSizeBinary => {
            let fsb = field.type_as_fixed_size_binary().ok_or_else(missing)?;
            if fsb.byteWidth() < 0 {
                return bad(format!("width {}", fsb.byteWidth()));
            }
            return Ok(());
        }
        Type::FloatingPoint => {
            let float = field.type_as_floating_point().ok_or_else(missing)?;
            return match float.precision() {
                ipc::Precision::HALF | ipc::Precision::SINGLE | ipc::Precision::DOUBLE => Ok(()),
                p => bad(format!("precision {p:?}")),
            };
        }
        Type::Date => {
            let date = field.type_as_date().ok_or_else(missing)?;
            return match date.unit() {
                ipc::DateUnit::DAY | ipc::DateUnit::MILLISECOND => Ok(()),
                u => bad(format!("unit {u:?}")),
            };
        }
        Type::Time => {
            let time = field.type_as_time().ok_or_else(missing)?;
            use ipc::TimeUnit as U;
            return match (time.bitWidth(), time.unit()) {
                (32, U::SECOND | U::MILLISECOND) | (64, U::MICROSECOND | U::NANOSECOND) => Ok(()),
                (bits, u) => bad(format!("{bits} bits in {u:?}")),
            };
        }
        Type::Timestamp | Type::Duration => {
            let unit = if t == Type::Timestamp {
                field.type_as_timestamp().map(|ts| ts.unit())
            } else {
                field.type_as_duration().map(|d| d.unit())
            };
            use ipc::TimeUnit as U;
            return match unit.ok_or_else(missing)? {
                U::SECOND | U::MILLISECOND | U::MICROSECOND | U::NANOSECOND => Ok(()),
                u => bad(format!("unit {u:?}")),
            };
        }
        Type::Interval => {
            let interval = field.type_as_interval().ok_or_else(missing)?;
            use ipc::IntervalUnit as U;
            return match interval.unit() {
                U::YEAR_MONTH | U::DAY_TIME | U::MONTH_DAY_NANO => Ok(()),
                u => bad(format!("unit {u:?}")),
            };
        }
        Type::Decimal => {
            let decimal = field.type_as_decimal().ok_or_else(missing)?;
            if u8::try_from(decimal.precision()).is_err()
                || i8::try_from(decimal.scale()).is_err()
                || !matches!(decimal.bitWidth(), 32 | 64 | 128 | 256)
            {
                return bad(format!(
                    "precision {}, scale {}, {} bits",
                    decimal.precision(),
                    decimal.scale(),
                    decimal.bitWidth()
                ));
            }
            return Ok(());
        }
        Type::List | Type::LargeList | Type::ListView | Type::LargeListView => needs_children(1)?,
        Type::FixedSizeList => {
            needs_children(1)?;
            let fsl = field.type_as_fixed_size_list().ok_or_else(missing)?;
            if fsl.listSize() < 0 {
                return bad(format!("size {}", fsl.listSize()));
            }
        }
        Type::Map => {
            field.type_as_map().ok_or_else(missing)?;
            needs_children(1)?;
        }
        Type::RunEndEncoded => needs_children(2)?,
        Type::Struct_ => {}
        Type::Union => {
            let union = field.type_as_union().ok_or_else(missing)?;
            if !matches!(union.mode(), ipc::UnionMode::Sparse | ipc::UnionMode::Dense) {
                return bad(format!("mode {:?}", union.mode()));
            }
            // `UnionFields::try_new(..).expect(..)` and `UnionFields::from_fields`.
            match union.typeIds() {
                None if count > 128 => return bad(format!("{count} members")),
                None => {}
                Some(ids) => {
                    let mut seen = 0u128;
                    for id in ids.iter().map(|i| i as i8) {
                        if id < 0 || seen & (1 << id) != 0 {
                            return bad(format!("type id {id}"));
                        }
                        seen |= 1 << id;
                    }
                    if ids.len() != count {
                        return bad(format!("{} type ids for {count} members", ids.len()));
                    }
                }
            }
        }
        other => return bad(format!("type {other:?} is not an Arrow type")),
    }
    for child in children.into_iter().flatten() {
        check_field(child)?;
    }
    Ok(())
}

/// Standard base64 (the padding optional); `None` on any other character.
/// Accepts whatever the parquet crate's decoder accepts, with the same result.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_like_the_standard_alphabet() {
        assert_eq!(decode_base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(decode_base64("aGVsbG8").unwrap(), b"hello");
        assert_eq!(decode_base64("/+A=").unwrap(), [0xff, 0xe0]);
        assert_eq!(decode_base64("").unwrap(), b"");
        assert!(decode_base64("a b").is_none());
    }
}
