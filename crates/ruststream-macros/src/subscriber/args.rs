//! The arguments of `#[subscriber(..)]`: the source, then `reply`/`reply("key")`, or `batch = n`
//! and `max_wait = d`; and `timeout = d` with either.

use syn::parse::{Parse, ParseStream};
use syn::{Error, Expr, Ident, Token};

/// What the attribute says.
pub(super) struct Args {
    pub(super) source: Expr,
    pub(super) reply: Option<Reply>,
    /// `batch = n`: the keyword and the size.
    pub(super) batch: Option<(Ident, Expr)>,
    /// `max_wait = d`: the keyword and the duration.
    pub(super) max_wait: Option<(Ident, Expr)>,
    /// `timeout = d`: the keyword and the duration (the source's `.timeout(d)`).
    pub(super) timeout: Option<(Ident, Expr)>,
}

/// `reply` or `reply("key")`.
pub(super) struct Reply {
    pub(super) keyword: Ident,
    pub(super) to: Option<Expr>,
}

const OPTIONS_HELP: &str = "after the source, #[subscriber] takes only `reply` (publish the return value to its type's outgoing name), `reply(\"key\")`, or `batch = n` with an optional `max_wait = duration` (for an `async fn` taking `&[T]`), and `timeout = duration` (how long one call may run, e.g. `timeout = Duration::from_secs(30)`); configure the source with its own methods, e.g. `RedisList::new(\"jobs\").concurrency(8)`";

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.is_empty() {
            return Err(input
                .error("#[subscriber] needs a source: `#[subscriber(RedisList::new(\"jobs\"))]`"));
        }
        let source: Expr = input.parse()?;
        let mut reply: Option<Reply> = None;
        let mut batch = None;
        let mut max_wait = None;
        let mut timeout = None;
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let keyword: Ident = input
                .parse()
                .map_err(|e| Error::new(e.span(), OPTIONS_HELP))?;
            if keyword == "batch" || keyword == "max_wait" || keyword == "timeout" {
                let slot = if keyword == "batch" {
                    &mut batch
                } else if keyword == "max_wait" {
                    &mut max_wait
                } else {
                    &mut timeout
                };
                *slot = Some(assigned(input, keyword, slot.is_some())?);
                continue;
            }
            if keyword != "reply" {
                return Err(Error::new(
                    keyword.span(),
                    format!("unknown option `{keyword}`: {OPTIONS_HELP}"),
                ));
            }
            if reply.is_some() {
                return Err(Error::new(
                    keyword.span(),
                    "`reply` is given twice: keep one",
                ));
            }
            let to = if input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in input);
                if content.is_empty() {
                    return Err(Error::new(
                        keyword.span(),
                        "`reply()` needs a key, `reply(\"key\")`, or no parentheses to reply to the type's outgoing name",
                    ));
                }
                let to: Expr = content.parse()?;
                if !content.is_empty() {
                    return Err(content.error("`reply(..)` takes one key: `reply(\"key\")`"));
                }
                Some(to)
            } else if input.peek(Token![=]) {
                return Err(Error::new(
                    keyword.span(),
                    "write the reply key in parentheses: `reply(\"key\")`",
                ));
            } else {
                None
            };
            reply = Some(Reply { keyword, to });
        }
        if let (Some(reply), Some(_)) = (&reply, &batch) {
            return Err(Error::new(
                reply.keyword.span(),
                "a batch subscriber does not reply: remove `reply` (publish from the handler with `ctx.publisher()`)",
            ));
        }
        if let (Some((keyword, _)), None) = (&max_wait, &batch) {
            return Err(Error::new(
                keyword.span(),
                "`max_wait` is the wait of a batch: add `batch = n`, or remove `max_wait`",
            ));
        }
        Ok(Self {
            source,
            reply,
            batch,
            max_wait,
            timeout,
        })
    }
}

/// The `= <expr>` after an option keyword such as `batch`.
fn assigned(input: ParseStream<'_>, keyword: Ident, given: bool) -> syn::Result<(Ident, Expr)> {
    if given {
        return Err(Error::new(
            keyword.span(),
            format!("`{keyword}` is given twice: keep one"),
        ));
    }
    if !input.peek(Token![=]) {
        return Err(Error::new(
            keyword.span(),
            format!("give `{keyword}` a value: `{keyword} = ..`"),
        ));
    }
    input.parse::<Token![=]>()?;
    let value: Expr = input.parse()?;
    Ok((keyword, value))
}
