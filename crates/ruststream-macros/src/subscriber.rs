//! `#[subscriber(SOURCE, reply(..))]` on an `async fn`, or `#[subscriber(SOURCE, batch = n,
//! max_wait = d)]` on an `async fn` taking `&[T]`; either may add `timeout = d` (a
//! `std::time::Duration` expression, like `max_wait`), which becomes the source's `.timeout(d)`.
//!
//! Expands to a unit struct named like the function that implements `Handle` (the function itself
//! becomes an associated `async fn`, its result converted with `IntoHandlerResult`) and
//! `IntoSubscriber` (through `subscriber(SOURCE, handler).build()`, as a hand-written subscriber).
//! With `batch`, the struct implements `HandleBatch` instead (the result converted with
//! `IntoBatchOutcome`) and the subscriber is `subscriber(SOURCE, handler).batch(n).build()`.
//! The broker is `<Type as Source>::Broker`, where `Type` is read off the source expression:
//! `RedisList::new("k").reliable()` gives `RedisList`.

mod args;
mod steps;

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{
    Attribute, Error, Expr, FnArg, GenericArgument, ItemFn, PathArguments, ReturnType, Type,
};

use self::args::{Args, Reply};

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args: Args = syn::parse2(attr)?;
    let func: ItemFn = syn::parse2(item).map_err(|e| {
        Error::new(
            e.span(),
            "#[subscriber] goes on an `async fn` that takes the message by reference: `async fn handle(msg: &T) -> HandlerOutcome`",
        )
    })?;
    let sig = checked_signature(&func, args.batch.is_some())?;
    let source_ty = source_type(&args.source).ok_or_else(|| {
        Error::new(
            args.source.span(),
            "cannot tell the broker from this source: write it as `Type::new(..)` followed by builder methods, e.g. `RedisList::new(\"jobs\").reliable()`, or build the subscriber by hand with `subscriber(source, handler).build()`",
        )
    })?;
    if let Some(reply) = &args.reply {
        check_reply_output(&func.sig.output, reply)?;
    }

    let ItemFn {
        attrs,
        vis,
        sig: fn_sig,
        block,
    } = &func;
    let name = &fn_sig.ident;
    let inputs = &fn_sig.inputs;
    let output = &fn_sig.output;
    let in_ty = sig.message;
    let docs: Vec<&Attribute> = attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    // `#[cfg]` on the function applies to everything generated from it.
    let cfgs: Vec<&Attribute> = attrs.iter().filter(|a| a.path().is_ident("cfg")).collect();

    let ret_ty: Type = match output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, ty) => (**ty).clone(),
    };
    let ctx_ident = if sig.has_ctx {
        quote!(ctx)
    } else {
        quote!(_ctx)
    };
    let call = if sig.has_ctx {
        quote!(#name::#name(msg, ctx))
    } else {
        quote!(#name::#name(msg))
    };

    // A batch context has no steps.
    let steps = match sig.ctx {
        Some(ctx) if args.batch.is_none() && steps::uses_steps(block.to_token_stream(), ctx) => {
            quote!(.uses_steps())
        }
        _ => quote!(),
    };
    let parts = Parts {
        name,
        in_ty,
        ret_ty: &ret_ty,
        cfgs: &cfgs,
        ctx_ident: &ctx_ident,
        call: &call,
    };
    let (handle_impl, build) = match &args.batch {
        Some((_, size)) => {
            let max_wait = args.max_wait.as_ref().map(|(_, d)| d);
            batch_impl(&Batch { size, max_wait }, &parts)
        }
        None => handle_impl(&args, &parts),
    };

    let source = match &args.timeout {
        // The type ascription makes a value that is not a `Duration` an error at the value.
        Some((_, d)) => {
            let d = quote_spanned! {d.span()=> {
                let timeout: ::std::time::Duration = #d;
                timeout
            }};
            let source = &args.source;
            quote!((#source).timeout(#d))
        }
        None => {
            let source = &args.source;
            quote!(#source)
        }
    };
    let broker = quote_spanned! {source_ty.span()=>
        <#source_ty as ::ruststream::Source>::Broker
    };
    Ok(quote! {
        #(#cfgs)*
        #(#docs)*
        #[allow(non_camel_case_types)]
        #vis struct #name;

        #(#cfgs)*
        impl #name {
            #(#attrs)*
            #vis async fn #name(#inputs) #output #block
        }

        #handle_impl

        #(#cfgs)*
        impl ::ruststream::IntoSubscriber for #name {
            type Broker = #broker;

            fn into_subscriber(self) -> ::ruststream::Subscriber<Self::Broker> {
                ::ruststream::subscriber(#source, self)#steps #build
            }
        }
    })
}

/// What the generated handler impl is made of.
struct Parts<'a> {
    /// The function's (and the generated type's) name.
    name: &'a syn::Ident,
    /// The message type.
    in_ty: &'a Type,
    /// The function's return type.
    ret_ty: &'a Type,
    /// The function's `#[cfg]`s.
    cfgs: &'a [&'a Attribute],
    /// `ctx`, or `_ctx` when the function takes no context.
    ctx_ident: &'a TokenStream,
    /// The call of the function on `msg` (and `ctx`).
    call: &'a TokenStream,
}

/// The `Handle` impl of the generated type, and the builder calls that finish its subscriber
/// (`.build()`, or `.reply()[.to(..)].build()`).
fn handle_impl(args: &Args, parts: &Parts<'_>) -> (TokenStream, TokenStream) {
    let Parts {
        name,
        in_ty,
        ret_ty,
        cfgs,
        ctx_ident,
        call,
    } = parts;
    let ret_span = ret_ty.span();
    match &args.reply {
        None => {
            let convert = quote_spanned! {ret_span=>
                <#ret_ty as ::ruststream::__private::IntoHandlerResult<()>>::into_handler_result
            };
            let handle_impl = quote! {
                #(#cfgs)*
                impl ::ruststream::Handle<#in_ty> for #name {
                    fn handle(
                        &self,
                        msg: &#in_ty,
                        _outs: &(),
                        #ctx_ident: &mut ::ruststream::Context<'_>,
                    ) -> impl ::core::future::Future<
                        Output = ::core::result::Result<(), ::ruststream::HandlerOutcome>,
                    > + ::core::marker::Send {
                        async move { #convert(#call.await) }
                    }
                }
            };
            (handle_impl, quote!(.build()))
        }
        Some(reply) => {
            let handle_impl = quote! {
                #(#cfgs)*
                impl<__RustStreamOut> ::ruststream::Handle<#in_ty, __RustStreamOut> for #name
                where
                    #ret_ty: ::ruststream::__private::IntoHandlerResult<__RustStreamOut>,
                {
                    fn handle(
                        &self,
                        msg: &#in_ty,
                        _outs: &(),
                        #ctx_ident: &mut ::ruststream::Context<'_>,
                    ) -> impl ::core::future::Future<
                        Output = ::core::result::Result<__RustStreamOut, ::ruststream::HandlerOutcome>,
                    > + ::core::marker::Send {
                        async move {
                            <#ret_ty as ::ruststream::__private::IntoHandlerResult<__RustStreamOut>>::into_handler_result(
                                #call.await,
                            )
                        }
                    }
                }
            };
            let kw = &reply.keyword;
            let reply_call = quote_spanned!(kw.span()=> .reply());
            let build = match &reply.to {
                Some(to) => quote!(#reply_call.to(#to).build()),
                None => quote!(#reply_call.build()),
            };
            (handle_impl, build)
        }
    }
}

/// `batch = size` and `max_wait = d`.
struct Batch<'a> {
    size: &'a Expr,
    max_wait: Option<&'a Expr>,
}

/// The `HandleBatch` impl of the generated type, and the builder calls that finish its subscriber
/// (`.batch(n)[.max_wait(d)].build()`).
fn batch_impl(batch: &Batch<'_>, parts: &Parts<'_>) -> (TokenStream, TokenStream) {
    let (name, in_ty, ret_ty) = (parts.name, parts.in_ty, parts.ret_ty);
    let (cfgs, ctx_ident, call) = (parts.cfgs, parts.ctx_ident, parts.call);
    let convert = quote_spanned! {ret_ty.span()=>
        <#ret_ty as ::ruststream::__private::IntoBatchOutcome>::into_batch_outcome
    };
    let handle_impl = quote! {
        #(#cfgs)*
        impl ::ruststream::HandleBatch<#in_ty> for #name {
            fn handle_batch(
                &self,
                msg: &[#in_ty],
                #ctx_ident: &mut ::ruststream::BatchContext<'_>,
            ) -> impl ::core::future::Future<Output = ::ruststream::BatchOutcome>
                   + ::core::marker::Send {
                async move { #convert(#call.await) }
            }
        }
    };
    let size = batch.size;
    let build = match batch.max_wait {
        Some(d) => quote!(.batch(#size).max_wait(#d).build()),
        None => quote!(.batch(#size).build()),
    };
    (handle_impl, build)
}

/// What the function's signature says.
struct Signature<'a> {
    /// `T` of the first parameter `&T` (`&[T]` for a batch).
    message: &'a Type,
    /// Whether a `ctx: &mut Context<'_>` (`&mut BatchContext<'_>`) follows.
    has_ctx: bool,
    /// The context parameter's name, when it is a plain name.
    ctx: Option<&'a syn::Ident>,
}

fn checked_signature(func: &ItemFn, batch: bool) -> syn::Result<Signature<'_>> {
    let sig = &func.sig;
    check_modifiers(sig)?;
    let mut inputs = sig.inputs.iter();
    let Some(first) = inputs.next() else {
        return Err(Error::new(
            sig.paren_token.span.join(),
            "a subscriber takes the message by reference: `async fn handle(msg: &T)`",
        ));
    };
    let message = match first {
        FnArg::Receiver(r) => {
            return Err(Error::new(
                r.span(),
                "a subscriber is a free `async fn`, not a method: remove `self` and take the message as `msg: &T`",
            ));
        }
        FnArg::Typed(p) => match &*p.ty {
            Type::Reference(r) if r.mutability.is_none() => message_type(&r.elem, batch)?,
            Type::Reference(r) => {
                return Err(Error::new(
                    r.span(),
                    "take the message by shared reference: `&T`, not `&mut T`",
                ));
            }
            other => {
                return Err(Error::new(
                    other.span(),
                    format!(
                        "take the message by reference: `&{}`",
                        quote!(#other).to_string().replace(' ', "")
                    ),
                ));
            }
        },
    };
    let (has_ctx, ctx) = match inputs.next() {
        None => (false, None),
        Some(FnArg::Typed(p)) if matches!(&*p.ty, Type::Reference(r) if r.mutability.is_some()) => {
            let ctx = match &*p.pat {
                syn::Pat::Ident(i) => Some(&i.ident),
                _ => None,
            };
            (true, ctx)
        }
        Some(other) => {
            return Err(Error::new(
                other.span(),
                "the second parameter of a subscriber is its context: `ctx: &mut Context<'_>`",
            ));
        }
    };
    if let Some(extra) = inputs.next() {
        return Err(Error::new(
            extra.span(),
            "a subscriber takes at most two parameters: the message `&T` and `ctx: &mut Context<'_>`",
        ));
    }
    Ok(Signature {
        message,
        has_ctx,
        ctx,
    })
}

/// The message type of a handler taking `&elem`: `elem`, or `T` of `[T]` for a batch.
fn message_type(elem: &Type, batch: bool) -> syn::Result<&Type> {
    match (elem, batch) {
        (Type::Slice(s), true) => Ok(&*s.elem),
        (Type::Slice(s), false) => {
            let t = &s.elem;
            Err(Error::new(
                elem.span(),
                format!(
                    "a subscriber taking `&[{}]` handles batches: add `batch = n` (and `max_wait = d`) after the source",
                    quote!(#t).to_string().replace(' ', "")
                ),
            ))
        }
        (other, true) => Err(Error::new(
            other.span(),
            format!(
                "a batch subscriber takes its messages as a slice: `items: &[{}]`",
                quote!(#other).to_string().replace(' ', "")
            ),
        )),
        (other, false) => Ok(other),
    }
}

/// A subscriber is a plain `async fn`: no `const`, `unsafe`, ABI, generics or variadics.
fn check_modifiers(sig: &syn::Signature) -> syn::Result<()> {
    if sig.asyncness.is_none() {
        return Err(Error::new(
            sig.fn_token.span(),
            "#[subscriber] needs an `async fn`: write `async fn`",
        ));
    }
    if let Some(c) = &sig.constness {
        return Err(Error::new(
            c.span(),
            "a subscriber cannot be `const`: remove `const`",
        ));
    }
    if let Some(u) = &sig.unsafety {
        return Err(Error::new(
            u.span(),
            "a subscriber cannot be `unsafe`: remove `unsafe`",
        ));
    }
    if let Some(abi) = &sig.abi {
        return Err(Error::new(
            abi.span(),
            "a subscriber cannot have an ABI: remove `extern`",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(Error::new(
            sig.generics.span(),
            "a subscriber cannot be generic or name lifetimes: take `&T` for one concrete message type `T`, with elided lifetimes",
        ));
    }
    if let Some(v) = &sig.variadic {
        return Err(Error::new(v.span(), "a subscriber cannot be variadic"));
    }
    Ok(())
}

/// With `reply`, the function returns what is published: catch the returns that publish nothing.
fn check_reply_output(output: &ReturnType, reply: &Reply) -> syn::Result<()> {
    let (span, what) = match output {
        ReturnType::Default => (reply.keyword.span(), "nothing".to_owned()),
        ReturnType::Type(_, ty) => {
            let ok_ty = result_ok_type(ty).unwrap_or(ty);
            if is_unit(ok_ty) || last_ident_is(ok_ty, "HandlerOutcome") {
                (ty.span(), format!("`{}`", quote!(#ty)))
            } else {
                return Ok(());
            }
        }
    };
    Err(Error::new(
        span,
        format!(
            "with `reply`, the subscriber's return value is the reply, but it returns {what}: return the reply message type (or `Result<Reply, E>`), or remove `reply`"
        ),
    ))
}

/// `T` of `Result<T, ..>` (any path ending in `Result`).
fn result_ok_type(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    args.args.iter().find_map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}

fn is_unit(ty: &Type) -> bool {
    matches!(ty, Type::Tuple(t) if t.elems.is_empty())
}

fn last_ident_is(ty: &Type, name: &str) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == name))
}

/// The type a source expression is built from: the innermost `Path::ctor(..)` of a method-call
/// chain, without `ctor`.
fn source_type(expr: &Expr) -> Option<Type> {
    match expr {
        Expr::MethodCall(m) => source_type(&m.receiver),
        Expr::Paren(p) => source_type(&p.expr),
        Expr::Group(g) => source_type(&g.expr),
        Expr::Call(call) => {
            let Expr::Path(func) = &*call.func else {
                return None;
            };
            let segments = &func.path.segments;
            match &func.qself {
                // `<Type>::ctor(..)`
                Some(q) if q.position == 0 && segments.len() == 1 => Some((*q.ty).clone()),
                Some(_) => None,
                None if segments.len() >= 2 => {
                    let mut path = func.path.clone();
                    path.segments = segments.iter().take(segments.len() - 1).cloned().collect();
                    Some(Type::Path(syn::TypePath { qself: None, path }))
                }
                None => None,
            }
        }
        _ => None,
    }
}
