//! Whether a subscriber's body uses durable steps: a call such as `ctx.step(..)` on its context
//! parameter, of one of [`METHODS`]. The generated subscriber then says so (`.uses_steps()`),
//! and the app refuses to start on a source that cannot redeliver. The scan reads tokens, so it
//! sees calls in closures, async blocks and macro arguments (`tokio::select!`). It cannot see
//! the steps of a helper function that gets the context: those fail at run time instead.

use proc_macro2::{Ident, TokenStream, TokenTree};

/// The context's methods that need a source that redelivers (`step_key` does not).
const METHODS: [&str; 6] = [
    "step",
    "sleep",
    "sleep_until",
    "wait_for",
    "checkpoint",
    "resume_from",
];

/// Whether `body` calls one of [`METHODS`] on `ctx`.
pub(super) fn uses_steps(body: TokenStream, ctx: &Ident) -> bool {
    let tokens: Vec<TokenTree> = body.into_iter().collect();
    tokens.iter().enumerate().any(|(i, token)| match token {
        TokenTree::Group(g) => uses_steps(g.stream(), ctx),
        TokenTree::Ident(id) if id == ctx => {
            // `ctx` itself, not a field `x.ctx` or a path `m::ctx`.
            let own = i == 0 || !is_punct(&tokens[i - 1], &['.', ':']);
            let method = match (tokens.get(i + 1), tokens.get(i + 2)) {
                (Some(dot), Some(TokenTree::Ident(m))) if is_punct(dot, &['.']) => {
                    METHODS.contains(&m.to_string().as_str())
                }
                _ => false,
            };
            own && method
        }
        _ => false,
    })
}

fn is_punct(token: &TokenTree, chars: &[char]) -> bool {
    matches!(token, TokenTree::Punct(p) if chars.contains(&p.as_char()))
}

#[cfg(test)]
mod tests {
    use quote::{format_ident, quote};

    use super::uses_steps;

    fn uses(body: proc_macro2::TokenStream) -> bool {
        uses_steps(body, &format_ident!("ctx"))
    }

    #[test]
    fn a_step_on_the_context_counts() {
        assert!(uses(quote!({
            ctx.step("a", || async { Ok(1) }).await?;
        })));
        assert!(uses(quote!({
            let c = ctx.resume_from::<u32>().await?;
        })));
        assert!(uses(quote!({
            for p in 0..3 {
                ctx.checkpoint(&p).await?;
            }
        })));
        assert!(uses(quote!({ ctx.wait_for::<Paid>("paid", d).await? })));
        assert!(uses(quote!({
            ctx.sleep_until(t).await?;
        })));
        assert!(
            uses(quote!({
                tokio::select! { r = ctx.sleep(d) => r?, () = other() => {} }
            })),
            "inside a macro's arguments"
        );
        assert!(uses(quote!({
            let f = async { ctx.step("a", f).await };
        })));
        assert!(
            uses_steps(
                quote!({
                    c.checkpoint(&1).await?;
                }),
                &format_ident!("c")
            ),
            "the context parameter's own name"
        );
    }

    #[test]
    fn other_calls_do_not_count() {
        assert!(!uses(quote!({
            tokio::time::sleep(d).await;
        })));
        assert!(!uses(quote!({
            let key = ctx.step_key("charge");
        })));
        assert!(!uses(quote!({
            ctx.progress(&50).await?;
            ctx.attempt();
        })));
        assert!(!uses(quote!({
            other.step("a", f).await?;
            self.ctx.sleep(d);
        })));
        assert!(!uses(quote!({
            m::ctx.sleep(d);
            std::thread::sleep(d);
        })));
        assert!(
            !uses_steps(
                quote!({
                    ctx.step("a", f).await?;
                }),
                &format_ident!("c")
            ),
            "another name than the context parameter's"
        );
        assert!(!uses(quote!({ helper(ctx).await })), "a helper is not seen");
    }
}
