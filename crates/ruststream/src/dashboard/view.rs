//! How untrusted values show on a page: payloads pretty-printed and cut to a size, headers one
//! per line. Every value goes through maud's escaping, so HTML in a payload or a header shows
//! as text; a payload that is not UTF-8 shows as a note of its size (the operator library
//! decodes it so).

use maud::{Markup, html};
use ruststream_core::Headers;

/// Most characters of a payload a page shows.
pub(super) const PAYLOAD_SHOWN: usize = 16 * 1024;

/// The payload, pretty when it is JSON, cut to [`PAYLOAD_SHOWN`] characters with a note.
pub(super) fn payload(v: &serde_json::Value, size: Option<usize>) -> Markup {
    let text = match v {
        serde_json::Value::String(s) => s.clone(),
        v => serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()),
    };
    let (shown, cut) = cut(&text, PAYLOAD_SHOWN);
    html! {
        pre.payload { (shown) }
        @if cut { small.muted { "(cut at " (PAYLOAD_SHOWN) " characters) " } }
        @if let Some(size) = size { small.muted { (size) " bytes" } }
    }
}

/// `text` cut to at most `most` characters (on a character boundary), and whether it was cut.
fn cut(text: &str, most: usize) -> (&str, bool) {
    match text.char_indices().nth(most) {
        Some((at, _)) => (&text[..at], true),
        None => (text, false),
    }
}

/// The headers, one `name=value` a line.
pub(super) fn headers(h: &Headers) -> Markup {
    html! { @for (k, v) in h { code { (k) "=" (cut(v, 1024).0) } br; } }
}

/// `text` encoded for a query string's value.
pub(super) fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_in_a_payload_or_header_shows_as_text() {
        let evil = serde_json::json!({"note": "<script>alert(1)</script>"});
        let page = payload(&evil, Some(40)).into_string();
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;"), "{page}");
        let mut h = Headers::new();
        h.insert("x-evil".into(), "<img src=x onerror=alert(1)>".into());
        let page = headers(&h).into_string();
        assert!(!page.contains("<img"), "{page}");
        assert!(page.contains("&lt;img"), "{page}");
    }

    #[test]
    fn a_huge_payload_is_cut_and_a_binary_one_is_a_note() {
        let huge = serde_json::Value::String("é".repeat(100_000));
        let page = payload(&huge, Some(200_000)).into_string();
        assert!(page.contains("cut at"), "cut");
        assert!(page.len() < 3 * PAYLOAD_SHOWN, "{}", page.len());
        let binary = serde_json::Value::String("<3 bytes, not UTF-8>".into());
        let page = payload(&binary, Some(3)).into_string();
        assert!(page.contains("&lt;3 bytes, not UTF-8&gt;"), "{page}");
        assert_eq!(urlencode("a b&c"), "a+b%26c");
    }
}
