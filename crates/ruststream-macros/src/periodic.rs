//! `#[periodic("CRON", tz = "ZONE", to = "key", name = "..", catch_up = "skip" | "run-once")]`
//! on a `fn` or `async fn` without arguments that returns the tick's message.
//!
//! Expands to a unit struct named like the function (the function becomes its associated fn)
//! that implements `IntoPeriodic` through `Periodic::new(name, cron, UTC).tz_named(zone)..`,
//! as a hand-written job. The expression and the zone are checked here, at compile time, with
//! the crates the runtime reads them with.

use std::str::FromStr;

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{Error, ItemFn, LitStr, ReturnType, Token};

/// The attribute's arguments.
struct Args {
    cron: LitStr,
    tz: Option<LitStr>,
    to: Option<LitStr>,
    name: Option<LitStr>,
    catch_up: Option<LitStr>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let cron: LitStr = input.parse().map_err(|e| {
            Error::new(
                e.span(),
                "#[periodic] starts with the cron expression: `#[periodic(\"0 */5 * * * *\", tz = \"UTC\")]`",
            )
        })?;
        let mut args = Args {
            cron,
            tz: None,
            to: None,
            name: None,
            catch_up: None,
        };
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: syn::Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let value: LitStr = input.parse()?;
            let slot = match key.to_string().as_str() {
                "tz" => &mut args.tz,
                "to" => &mut args.to,
                "name" => &mut args.name,
                "catch_up" => &mut args.catch_up,
                other => {
                    return Err(Error::new(
                        key.span(),
                        format!(
                            "unknown option `{other}`: #[periodic] takes `tz`, `to`, `name` and `catch_up`"
                        ),
                    ));
                }
            };
            if slot.replace(value).is_some() {
                return Err(Error::new(key.span(), format!("`{key}` is given twice")));
            }
        }
        Ok(args)
    }
}

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args: Args = syn::parse2(attr)?;
    let func: ItemFn = syn::parse2(item).map_err(|e| {
        Error::new(
            e.span(),
            "#[periodic] goes on a fn without arguments that returns the message: `fn report() -> Report`",
        )
    })?;
    if let Err(e) = cron::Schedule::from_str(args.cron.value().trim()) {
        let text = e.to_string();
        let detail = if text.contains('\n') {
            String::new()
        } else {
            format!(" ({text})")
        };
        return Err(Error::new(
            args.cron.span(),
            format!(
                "not a cron expression{detail}: write six or seven fields, seconds first (`sec min hour day-of-month month day-of-week [year]`), e.g. \"0 */5 * * * *\""
            ),
        ));
    }
    let tz = args.tz.as_ref().ok_or_else(|| {
        Error::new(
            args.cron.span(),
            "#[periodic] needs its time zone: add `tz = \"UTC\"` (or an IANA name such as \"Europe/Paris\")",
        )
    })?;
    if chrono_tz::Tz::from_str(&tz.value()).is_err() {
        return Err(Error::new(
            tz.span(),
            "not a time zone: use an IANA name such as \"UTC\" or \"Europe/Paris\"",
        ));
    }
    let catch_up = match args.catch_up.as_ref().map(LitStr::value).as_deref() {
        None | Some("skip") => quote!(::ruststream::periodic::CatchUp::Skip),
        Some("run-once") => quote!(::ruststream::periodic::CatchUp::RunOnce),
        Some(_) => {
            return Err(Error::new(
                args.catch_up
                    .as_ref()
                    .map_or(args.cron.span(), LitStr::span),
                "catch_up is \"skip\" (the default) or \"run-once\"",
            ));
        }
    };
    if !func.sig.inputs.is_empty() {
        return Err(Error::new(
            func.sig
                .inputs
                .first()
                .map_or(func.sig.ident.span(), syn::spanned::Spanned::span),
            "a #[periodic] fn takes no arguments: it returns the message of each tick",
        ));
    }
    if matches!(func.sig.output, ReturnType::Default) {
        return Err(Error::new(
            func.sig.ident.span(),
            "a #[periodic] fn returns the message of each tick: `fn report() -> Report`",
        ));
    }
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = &func;
    let ident = &sig.ident;
    let job_name = args
        .name
        .as_ref()
        .map_or_else(|| ident.to_string(), LitStr::value);
    let cron = &args.cron;
    let to = args.to.as_ref().map(|to| quote!(.to(#to)));
    let message = if sig.asyncness.is_some() {
        quote!(.message_async(|_| #ident::#ident()))
    } else {
        quote!(.message(#ident::#ident))
    };
    let docs: Vec<&syn::Attribute> = attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    let cfgs: Vec<&syn::Attribute> = attrs.iter().filter(|a| a.path().is_ident("cfg")).collect();
    Ok(quote! {
        #(#cfgs)*
        #(#docs)*
        #[allow(non_camel_case_types)]
        #vis struct #ident;

        #(#cfgs)*
        impl #ident {
            #(#attrs)*
            #vis #sig #block
        }

        #(#cfgs)*
        impl ::ruststream::periodic::IntoPeriodic for #ident {
            fn into_periodic(self) -> ::ruststream::periodic::Periodic {
                ::ruststream::periodic::Periodic::new(#job_name, #cron, ::ruststream::periodic::Tz::UTC)
                    .tz_named(#tz)
                    #to
                    .catch_up(#catch_up)
                    #message
            }
        }
    })
}
