//! `#[subscriber(SOURCE, reply(..))]` on an `async fn`.
//!
//! Expands to a unit struct named like the function that implements `Handle` (the function itself
//! becomes an associated `async fn`, its result converted with `IntoHandlerResult`) and
//! `IntoSubscriber` (through `subscriber(SOURCE, handler).build()`, as a hand-written subscriber).
//! The broker is `<Type as Source>::Broker`, where `Type` is read off the source expression:
//! `RedisList::new("k").reliable()` gives `RedisList`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{
    Attribute, Error, Expr, FnArg, GenericArgument, Ident, ItemFn, PathArguments, ReturnType,
    Token, Type,
};

/// What the attribute says.
struct Args {
    source: Expr,
    reply: Option<Reply>,
}

/// `reply` or `reply("key")`.
struct Reply {
    keyword: Ident,
    to: Option<Expr>,
}

const OPTIONS_HELP: &str = "after the source, #[subscriber] takes only `reply` (publish the return value to its type's outgoing name) or `reply(\"key\")`; configure the source with its own methods, e.g. `RedisList::new(\"jobs\").concurrency(8)`";

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.is_empty() {
            return Err(input
                .error("#[subscriber] needs a source: `#[subscriber(RedisList::new(\"jobs\"))]`"));
        }
        let source: Expr = input.parse()?;
        let mut reply: Option<Reply> = None;
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let keyword: Ident = input
                .parse()
                .map_err(|e| Error::new(e.span(), OPTIONS_HELP))?;
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
        Ok(Self { source, reply })
    }
}

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args: Args = syn::parse2(attr)?;
    let func: ItemFn = syn::parse2(item).map_err(|e| {
        Error::new(
            e.span(),
            "#[subscriber] goes on an `async fn` that takes the message by reference: `async fn handle(msg: &T) -> HandlerOutcome`",
        )
    })?;
    let sig = checked_signature(&func)?;
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

    let (handle_impl, build) = handle_impl(&args, name, in_ty, &ret_ty, &cfgs, &ctx_ident, &call);

    let source = &args.source;
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
                ::ruststream::subscriber(#source, self)#build
            }
        }
    })
}

/// The `Handle` impl of the generated type, and the builder calls that finish its subscriber
/// (`.build()`, or `.reply()[.to(..)].build()`).
fn handle_impl(
    args: &Args,
    name: &syn::Ident,
    in_ty: &Type,
    ret_ty: &Type,
    cfgs: &[&Attribute],
    ctx_ident: &TokenStream,
    call: &TokenStream,
) -> (TokenStream, TokenStream) {
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

/// What the function's signature says.
struct Signature<'a> {
    /// `T` of the first parameter `&T`.
    message: &'a Type,
    /// Whether a `ctx: &mut Context<'_>` follows.
    has_ctx: bool,
}

fn checked_signature(func: &ItemFn) -> syn::Result<Signature<'_>> {
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
            Type::Reference(r) if r.mutability.is_none() => &*r.elem,
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
    let has_ctx = match inputs.next() {
        None => false,
        Some(FnArg::Typed(p)) if matches!(&*p.ty, Type::Reference(r) if r.mutability.is_some()) => {
            true
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
    Ok(Signature { message, has_ctx })
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
