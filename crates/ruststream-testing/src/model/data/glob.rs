//! Redis's glob patterns (`KEYS`, `PSUBSCRIBE`, `PUBSUB CHANNELS`).

/// Redis's glob match for `KEYS` patterns: `*`, `?`, `[abc]`, `[^a]`, `[a-z]`, `\x`.
pub(crate) fn glob(pattern: &[u8], s: &[u8]) -> bool {
    match pattern.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && glob(rest, &s[1..]),
        Some((b'[', rest)) => {
            let Some((&c, tail)) = s.split_first() else {
                return false;
            };
            let (negate, mut p) = match rest.split_first() {
                Some((b'^', r)) => (true, r),
                _ => (false, rest),
            };
            let mut matched = false;
            loop {
                match p {
                    [] => return false,
                    [b']', r @ ..] => {
                        p = r;
                        break;
                    }
                    [b'\\', x, r @ ..] => {
                        matched |= *x == c;
                        p = r;
                    }
                    [a, b'-', b, r @ ..] if *b != b']' => {
                        matched |= (*a.min(b)..=*a.max(b)).contains(&c);
                        p = r;
                    }
                    [x, r @ ..] => {
                        matched |= *x == c;
                        p = r;
                    }
                }
            }
            matched != negate && glob(p, tail)
        }
        Some((b'\\', [x, rest @ ..])) => s.first() == Some(x) && glob(rest, &s[1..]),
        Some((x, rest)) => s.first() == Some(x) && glob(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_like_redis() {
        assert!(glob(b"rs:*", b"rs:jobs"));
        assert!(glob(b"h?llo", b"hello"));
        assert!(!glob(b"h?llo", b"hllo"));
        assert!(glob(b"h[ae]llo", b"hallo"));
        assert!(!glob(b"h[^e]llo", b"hello"));
        assert!(glob(b"h[a-c]llo", b"hbllo"));
        assert!(glob(b"\\{t\\}*", b"{t}.processing"));
    }
}
