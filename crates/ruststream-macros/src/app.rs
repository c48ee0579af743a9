//! `#[ruststream::app]`: keeps the function and adds `main`.

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::{Error, ItemFn, ReturnType};

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    if !attr.is_empty() {
        return Err(Error::new(
            attr.span(),
            "#[ruststream::app] takes no arguments: write `#[ruststream::app]` on `fn app() -> impl App`",
        ));
    }
    let func: ItemFn = syn::parse2(item).map_err(|e| {
        Error::new(
            e.span(),
            "#[ruststream::app] goes on the function that builds the application: `fn app() -> impl App { .. }`",
        )
    })?;
    let name = &func.sig.ident;
    // On a mistake, keep the function and a `main` so that the one error shown is the one here.
    let main = match check(&func) {
        Ok(()) => quote!(::ruststream::run_main(#name)),
        Err(e) if name == "main" => return Err(e),
        Err(e) => {
            let error = e.into_compile_error();
            quote!({ #error ::std::process::ExitCode::FAILURE })
        }
    };
    Ok(quote! {
        #func

        fn main() -> ::std::process::ExitCode {
            #main
        }
    })
}

fn check(func: &ItemFn) -> syn::Result<()> {
    let sig = &func.sig;
    if let Some(a) = &sig.asyncness {
        return Err(Error::new(
            a.span(),
            "the app function must not be `async`: it only builds the application, and `run_main` starts the runtime; remove `async`",
        ));
    }
    if !sig.inputs.is_empty() {
        return Err(Error::new(
            sig.inputs.span(),
            "the app function takes no parameters: read configuration inside it (e.g. `RedisBroker::from_env()`)",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(Error::new(
            sig.generics.span(),
            "the app function cannot be generic: return `impl App`",
        ));
    }
    if matches!(sig.output, ReturnType::Default) {
        return Err(Error::new(
            sig.ident.span(),
            "the app function returns the application: add `-> impl App`",
        ));
    }
    if sig.ident == "main" {
        return Err(Error::new(
            sig.ident.span(),
            "#[ruststream::app] generates `main`: name this function `app`",
        ));
    }
    Ok(())
}
