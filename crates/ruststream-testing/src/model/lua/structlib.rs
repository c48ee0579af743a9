//! The integer part of the `struct` library Redis gives its scripts: `struct.pack(fmt, ...)`
//! and `struct.unpack(fmt, data [, init])`.
//!
//! A format is a sequence of options: `>` big endian, `<` little endian, `=` native endian,
//! `!n` align each item to `min(size, n)` bytes (`!` alone: the native alignment, 8), and the
//! integers `b`/`B` (1 byte, signed/unsigned), `h`/`H` (2), `l`/`L` (8) and `i`/`I` (4, or
//! `in`/`In` for `n` bytes, 1 to 8); spaces are ignored. Numbers are truncated toward zero and
//! written in the item's size, so `struct.pack('>I4', 2^32 + 5)` keeps the low four bytes, as
//! Redis's C library does. `unpack` returns the values, then the position after the last byte.
//!
//! Redis's library has more options (`x`, `c`, `s`, `f`, `d`, sizes up to 32); the model fails
//! on them with an error that says it does not implement them, so a script needing them is
//! reported rather than run wrong. Errors read as Redis's do (`bad argument #1 to 'pack'
//! (invalid format option 'Q')`); `prelude.lua` raises them at the script's line.

/// A `pack` argument after the format: a number (or a string Lua reads as one), or the Lua type
/// name of anything else.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Arg {
    Number(f64),
    Other(&'static str),
}

/// The byte order of the items that follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Big,
    Little,
}

const NATIVE: Order = if cfg!(target_endian = "big") {
    Order::Big
} else {
    Order::Little
};

/// The alignment `!` alone selects: the largest alignment of a C scalar on the server.
const NATIVE_ALIGN: usize = 8;

/// The largest integer the model packs, in bytes.
const MAX_SIZE: usize = 8;

/// One integer item of a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Item {
    size: usize,
    signed: bool,
    order: Order,
    /// Padding bytes before the item, given the offset it starts at.
    align: usize,
}

/// Reads a format into its items; `Err` is the message of a bad first argument.
fn parse(format: &[u8]) -> Result<Vec<Item>, String> {
    let mut items = Vec::new();
    let (mut order, mut align) = (NATIVE, 1);
    let mut i = 0;
    while i < format.len() {
        let c = format[i];
        i += 1;
        let digits = format[i..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let number = std::str::from_utf8(&format[i..i + digits])
            .ok()
            .and_then(|d| d.parse::<usize>().ok());
        let (size, signed) = match c {
            b' ' => continue,
            b'>' => {
                order = Order::Big;
                continue;
            }
            b'<' => {
                order = Order::Little;
                continue;
            }
            b'=' => {
                order = NATIVE;
                continue;
            }
            b'!' => {
                i += digits;
                align = if digits == 0 {
                    NATIVE_ALIGN
                } else {
                    number.unwrap_or(usize::MAX)
                };
                continue;
            }
            b'b' | b'B' => (1, c == b'b'),
            b'h' | b'H' => (2, c == b'h'),
            b'l' | b'L' => (8, c == b'l'),
            b'i' | b'I' => {
                i += digits;
                let size = if digits == 0 {
                    4
                } else {
                    number.unwrap_or(usize::MAX)
                };
                if !(1..=MAX_SIZE).contains(&size) {
                    return Err(format!(
                        "integral size {size}: the in-memory Redis model does not implement sizes other than 1 to {MAX_SIZE}"
                    ));
                }
                (size, c == b'i')
            }
            b'x' | b'c' | b's' | b'f' | b'd' | b'T' => {
                return Err(format!(
                    "format option '{}': the in-memory Redis model does not implement it",
                    char::from(c)
                ));
            }
            other => {
                return Err(format!(
                    "invalid format option '{}'",
                    String::from_utf8_lossy(&[other])
                ));
            }
        };
        let align = size.min(align);
        if size > 1 && !align.is_power_of_two() {
            return Err("alignment must be power of 2".to_owned());
        }
        items.push(Item {
            size,
            signed,
            order,
            align,
        });
    }
    Ok(items)
}

/// Zero bytes to put before `item` when the data so far is `len` bytes long.
fn padding(item: &Item, len: usize) -> usize {
    if item.size <= 1 || item.align <= 1 {
        return 0;
    }
    (item.align - (len & (item.align - 1))) & (item.align - 1)
}

fn bad(n: usize, function: &str, message: &str) -> String {
    format!("bad argument #{n} to '{function}' ({message})")
}

/// `struct.pack(format, values...)`: `Err` is the Lua error message.
pub(crate) fn pack(format: &[u8], values: &[Arg]) -> Result<Vec<u8>, String> {
    let items = parse(format).map_err(|m| bad(1, "pack", &m))?;
    let mut out = Vec::new();
    for (n, item) in items.iter().enumerate() {
        let value = match values.get(n).copied().unwrap_or(Arg::Other("nil")) {
            Arg::Number(v) => v,
            Arg::Other(type_name) => {
                return Err(bad(
                    n + 2,
                    "pack",
                    &format!("number expected, got {type_name}"),
                ));
            }
        };
        out.resize(out.len() + padding(item, out.len()), 0);
        // Truncated toward zero; a negative number is written in two's complement.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let bits = if value < 0.0 {
            (value as i64) as u64
        } else {
            value as u64
        };
        let bytes = bits.to_le_bytes();
        let low = &bytes[..item.size];
        match item.order {
            Order::Little => out.extend_from_slice(low),
            Order::Big => out.extend(low.iter().rev()),
        }
    }
    Ok(out)
}

/// `struct.unpack(format, data, init)`: the values and the 1-based position after them; `Err`
/// is the Lua error message. `init` is the 1-based position to start at.
pub(crate) fn unpack(format: &[u8], data: &[u8], init: i64) -> Result<(Vec<f64>, i64), String> {
    let items = parse(format).map_err(|m| bad(1, "unpack", &m))?;
    if init == 0 {
        return Err(bad(3, "unpack", "offset must be 1 or greater"));
    }
    let too_short = || bad(2, "unpack", "data string too short");
    let mut pos = usize::try_from(init - 1).map_err(|_| too_short())?;
    let mut values = Vec::with_capacity(items.len());
    for item in &items {
        pos += padding(item, pos);
        let end = pos.checked_add(item.size).ok_or_else(too_short)?;
        let bytes = data.get(pos..end).ok_or_else(too_short)?;
        let mut buf = [0u8; 8];
        match item.order {
            Order::Little => buf[..item.size].copy_from_slice(bytes),
            Order::Big => {
                for (to, from) in buf[..item.size].iter_mut().zip(bytes.iter().rev()) {
                    *to = *from;
                }
            }
        }
        let bits = u64::from_le_bytes(buf);
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_wrap)]
        let value = if item.signed && item.size < 8 && (bits >> (item.size * 8 - 1)) & 1 == 1 {
            // Sign-extend: the top bit of the item's size is the sign.
            (bits | (u64::MAX << (item.size * 8))) as i64 as f64
        } else if item.signed {
            bits as i64 as f64
        } else {
            bits as f64
        };
        values.push(value);
        pos = end;
    }
    let next = i64::try_from(pos).map_or(i64::MAX, |p| p.saturating_add(1));
    Ok((values, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(v: f64) -> Arg {
        Arg::Number(v)
    }

    #[test]
    fn packs_big_and_little_endian_integers() {
        assert_eq!(pack(b">I4", &[n(258.0)]).unwrap(), b"\0\0\x01\x02");
        assert_eq!(pack(b"<I4", &[n(258.0)]).unwrap(), b"\x02\x01\0\0");
        assert_eq!(pack(b">I2", &[n(258.0)]).unwrap(), b"\x01\x02");
        assert_eq!(
            pack(b">I4>I2>I2", &[n(2.0), n(0.0), n(0.0)]).unwrap(),
            b"\0\0\0\x02\0\0\0\0"
        );
        assert_eq!(pack(b">I3", &[n(65_536.0 + 2.0)]).unwrap(), b"\x01\0\x02");
        assert_eq!(pack(b"bB", &[n(300.0), n(-1.0)]).unwrap(), b",\xff");
        assert_eq!(pack(b"<h", &[n(-2.0)]).unwrap(), b"\xfe\xff");
        assert_eq!(
            pack(b">l", &[n(-5.0)]).unwrap(),
            b"\xff\xff\xff\xff\xff\xff\xff\xfb"
        );
        assert_eq!(pack(b">L", &[n(1.0)]).unwrap(), b"\0\0\0\0\0\0\0\x01");
        assert_eq!(pack(b"", &[]).unwrap(), b"");
    }

    #[test]
    fn pack_truncates_and_wraps_like_c() {
        assert_eq!(pack(b">I4", &[n(-1.0)]).unwrap(), b"\xff\xff\xff\xff");
        assert_eq!(pack(b">I4", &[n(4_294_967_301.0)]).unwrap(), b"\0\0\0\x05");
        assert_eq!(pack(b">i4", &[n(3.7)]).unwrap(), b"\0\0\0\x03");
        assert_eq!(pack(b">i4", &[n(-3.7)]).unwrap(), b"\xff\xff\xff\xfd");
    }

    #[test]
    fn alignment_pads_to_the_item_size() {
        assert_eq!(
            pack(b"!4 b I4", &[n(1.0), n(2.0)]).unwrap(),
            b"\x01\0\0\0\x02\0\0\0"
        );
        assert_eq!(
            pack(b"!2 b I4", &[n(1.0), n(2.0)]).unwrap(),
            b"\x01\0\x02\0\0\0"
        );
        assert_eq!(pack(b"! I4", &[n(1.0)]).unwrap(), b"\x01\0\0\0");
        assert_eq!(
            unpack(b"!4 b I4", b"\x01\0\0\0\x02\0\0\0", 1).unwrap(),
            (vec![1.0, 2.0], 9)
        );
        assert_eq!(
            pack(b"!3 b I4", &[n(1.0), n(2.0)]).unwrap_err(),
            "bad argument #1 to 'pack' (alignment must be power of 2)"
        );
    }

    #[test]
    fn unpacks_values_then_the_next_position() {
        assert_eq!(
            unpack(b">I4", b"\0\0\x01\x02", 1).unwrap(),
            (vec![258.0], 5)
        );
        assert_eq!(unpack(b"<I3", b"abc", 1).unwrap(), (vec![6_513_249.0], 4));
        assert_eq!(
            unpack(b">I4", b"abcdef", 3).unwrap(),
            (vec![1_667_523_942.0], 7)
        );
        assert_eq!(
            unpack(b">I2>I2", b"\0\x01\0\x02", 1).unwrap(),
            (vec![1.0, 2.0], 5)
        );
        assert_eq!(unpack(b">i2", b"\xff\xfe", 1).unwrap(), (vec![-2.0], 3));
        assert_eq!(unpack(b">i8", &[0xff; 8], 1).unwrap(), (vec![-1.0], 9));
        assert_eq!(unpack(b">I1", b"\xff", 1).unwrap(), (vec![255.0], 2));
        assert_eq!(unpack(b">b", b"\xff", 1).unwrap(), (vec![-1.0], 2));
        assert_eq!(
            unpack(b">I8", b"\0\x20\0\0\0\0\0\0", 1).unwrap(),
            (vec![9_007_199_254_740_992.0], 9)
        );
    }

    #[test]
    fn round_trips() {
        for (format, v) in [
            (&b">I4"[..], 4_000_000_000.0),
            (b"<i4", -123_456.0),
            (b">h", -300.0),
            (b"<H", 65_535.0),
            (b">i6", -1.0),
            (b"=l", 1e15),
        ] {
            let packed = pack(format, &[n(v)]).unwrap();
            let (values, next) = unpack(format, &packed, 1).unwrap();
            assert_eq!(values, [v], "{}", String::from_utf8_lossy(format));
            assert_eq!(next, i64::try_from(packed.len()).unwrap() + 1);
        }
    }

    #[test]
    fn errors_read_as_redis_reads_them() {
        assert_eq!(
            pack(b">Q", &[n(1.0)]).unwrap_err(),
            "bad argument #1 to 'pack' (invalid format option 'Q')"
        );
        assert_eq!(
            pack(b">I4", &[]).unwrap_err(),
            "bad argument #2 to 'pack' (number expected, got nil)"
        );
        assert_eq!(
            pack(b">I4I4", &[n(1.0), Arg::Other("string")]).unwrap_err(),
            "bad argument #3 to 'pack' (number expected, got string)"
        );
        assert_eq!(
            unpack(b">I4", b"ab", 1).unwrap_err(),
            "bad argument #2 to 'unpack' (data string too short)"
        );
        assert_eq!(
            unpack(b">I4", b"abcd", 0).unwrap_err(),
            "bad argument #3 to 'unpack' (offset must be 1 or greater)"
        );
        assert_eq!(
            unpack(b">I4", b"abcd", -2).unwrap_err(),
            "bad argument #2 to 'unpack' (data string too short)"
        );
        assert_eq!(
            unpack(b">I4", b"abcd", 2).unwrap_err(),
            "bad argument #2 to 'unpack' (data string too short)"
        );
    }

    #[test]
    fn what_the_model_does_not_implement_says_so() {
        let e = pack(b">d", &[n(1.0)]).unwrap_err();
        assert!(e.contains("'d'") && e.contains("does not implement"), "{e}");
        let e = pack(b">I9", &[n(1.0)]).unwrap_err();
        assert!(
            e.contains("size 9") && e.contains("does not implement"),
            "{e}"
        );
        let e = unpack(b"x", b"a", 1).unwrap_err();
        assert!(e.contains("'x'") && e.contains("does not implement"), "{e}");
    }
}
