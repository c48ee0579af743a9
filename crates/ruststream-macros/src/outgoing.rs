//! `#[derive(Outgoing)]` with `#[outgoing(name = "...")]`.
//!
//! JSON on the wire (`json_encode` / `json_decode`), the name template checked against the fields
//! at compile time, and the schema from a hidden mirror of the type: same fields, same `#[serde]`
//! and `#[schemars]` attributes, deriving `JsonSchema` under the original name. The user's type
//! needs no `JsonSchema` derive.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Attribute, Data, DeriveInput, Error, Fields, GenericArgument, Ident, LitStr, Meta,
    PathArguments, Token, Type,
};

pub(crate) fn expand(input: TokenStream) -> syn::Result<TokenStream> {
    let input: DeriveInput = syn::parse2(input)?;
    let name = options(&input.attrs)?;
    if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
        return Err(Error::new(
            input.generics.span(),
            "#[derive(Outgoing)] does not support generic types: derive `Serialize`, `Deserialize` and `JsonSchema`, then write `outgoing!(MyType<Concrete>)` for each concrete type you publish",
        ));
    }
    if let Some(name) = &name {
        check_template(&input, name)?;
    }

    let ident = &input.ident;
    let mirror = format_ident!("__RustStreamSchemaOf{}", ident);
    let mirror_attrs = mirror_container_attrs(&input)?;
    let mirror_item = mirror_item(&input, &mirror)?;

    let name_const = match &name {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };
    let destination = match &name {
        None => quote!(::core::result::Result::Ok(::core::option::Option::None)),
        Some(n) if !n.value().contains('{') => quote! {
            ::core::result::Result::Ok(::core::option::Option::Some(
                ::std::borrow::Cow::Borrowed(#n),
            ))
        },
        Some(n) => quote! {
            ::ruststream::__private::message::fill_template(#n, self)
                .map(::core::option::Option::Some)
        },
    };

    Ok(quote! {
        const _: () = {
            #[derive(::ruststream::schemars::JsonSchema)]
            #(#mirror_attrs)*
            #[allow(dead_code, non_camel_case_types, clippy::all, clippy::pedantic)]
            #mirror_item

            impl ::ruststream::MessageType for #ident {
                const NAME: ::core::option::Option<&'static str> = #name_const;

                fn destination(
                    &self,
                ) -> ::core::result::Result<
                    ::core::option::Option<::std::borrow::Cow<'static, str>>,
                    ::ruststream::Error,
                > {
                    #destination
                }

                fn schema() -> ::ruststream::schemars::Schema {
                    ::ruststream::__private::message::schema_for::<#mirror>()
                }

                fn encode(
                    &self,
                ) -> ::core::result::Result<::ruststream::__private::Bytes, ::ruststream::Error> {
                    ::ruststream::__private::message::json_encode(self)
                }

                fn decode(payload: &[u8]) -> ::core::result::Result<Self, ::ruststream::Error> {
                    ::ruststream::__private::message::json_decode(payload)
                }
            }
        };
    })
}

/// Reads `#[outgoing(name = "...")]`.
fn options(attrs: &[Attribute]) -> syn::Result<Option<LitStr>> {
    let mut name: Option<LitStr> = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("outgoing")) {
        if matches!(attr.meta, Meta::Path(_)) {
            return Err(Error::new(
                attr.span(),
                "`#[outgoing]` needs an option: `#[outgoing(name = \"key\")]`, or leave the attribute out for a type without a default destination",
            ));
        }
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("name") {
                if name.is_some() {
                    return Err(meta.error("`name` is given twice: keep one"));
                }
                let lit: LitStr = meta.value()?.parse().map_err(|e| {
                    Error::new(e.span(), "the name is a string: `#[outgoing(name = \"key\")]`")
                })?;
                if lit.value().is_empty() {
                    return Err(Error::new(
                        lit.span(),
                        "the name is empty: give the key, or leave `name` out",
                    ));
                }
                name = Some(lit);
                Ok(())
            } else {
                let path = &meta.path;
                Err(meta.error(format!(
                    "unknown option `{}`: #[outgoing] takes `name = \"key\"` (braces read fields: `\"orders.{{tenant}}\"`)",
                    quote!(#path).to_string().replace(' ', "")
                )))
            }
        })?;
    }
    Ok(name)
}

/// The `{field}` placeholders of a template, as `fill_template` reads them.
fn placeholders(lit: &LitStr) -> syn::Result<Vec<String>> {
    let template = lit.value();
    let mut out = Vec::new();
    let mut rest = template.as_str();
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(Error::new(
                lit.span(),
                format!(
                    "the name template `{template}` has an unclosed `{{`: close it, e.g. `orders.{{tenant}}`"
                ),
            ));
        };
        let field = &after[..close];
        if field.is_empty() {
            return Err(Error::new(
                lit.span(),
                format!(
                    "the name template `{template}` has an empty `{{}}`: name a field inside, e.g. `{{tenant}}`"
                ),
            ));
        }
        out.push(field.to_owned());
        rest = &after[close + 1..];
    }
    Ok(out)
}

/// Each placeholder must name a field; hash tags (`{thumbnails}`) belong at the mount site.
fn check_template(input: &DeriveInput, lit: &LitStr) -> syn::Result<()> {
    let fields = placeholders(lit)?;
    let Some(first) = fields.first() else {
        return Ok(());
    };
    let hint = format!(
        "braces in `#[outgoing(name)]` read fields of the value; for a key with a Redis hash tag such as `{{{first}}}`, leave `name` out and name the key where the type is published: `reply(\"{}\")` in #[subscriber], or `.to(\"{}\")`",
        lit.value(),
        lit.value()
    );
    let ident = &input.ident;
    match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(named) => {
                // Renames and flattening change the serialized names: leave those to run time.
                let renamed = has_key(&input.attrs, &["rename_all", "transparent", "into"])
                    || named
                        .named
                        .iter()
                        .any(|f| has_key(&f.attrs, &["rename", "flatten"]));
                if renamed {
                    return Ok(());
                }
                let names: Vec<String> = named
                    .named
                    .iter()
                    .filter(|f| !has_key(&f.attrs, &["skip", "skip_serializing"]))
                    .filter_map(|f| f.ident.as_ref())
                    .map(|i| i.to_string().trim_start_matches("r#").to_owned())
                    .collect();
                for f in &fields {
                    if !names.contains(f) {
                        return Err(Error::new(
                            lit.span(),
                            format!(
                                "the name template reads field `{f}`, which `{ident}` does not serialize (its fields: {}); {hint}",
                                names.join(", ")
                            ),
                        ));
                    }
                }
                Ok(())
            }
            // `transparent` and `into` serialize as another type, whose fields the template reads.
            Fields::Unnamed(_) | Fields::Unit
                if has_key(&input.attrs, &["transparent", "into"]) =>
            {
                Ok(())
            }
            Fields::Unnamed(_) | Fields::Unit => Err(Error::new(
                lit.span(),
                format!(
                    "the name template reads field `{first}`, but `{ident}` has no named fields; {hint}"
                ),
            )),
        },
        Data::Enum(_) | Data::Union(_) => Ok(()),
    }
}

/// Whether a `#[serde]` or `#[schemars]` attribute sets one of `keys`.
fn has_key(attrs: &[Attribute], keys: &[&str]) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("serde") || a.path().is_ident("schemars"))
        .filter_map(|a| {
            a.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
                .ok()
        })
        .flatten()
        .any(|m| keys.iter().any(|k| m.path().is_ident(k)))
}

/// Attributes the mirror keeps: docs (schema descriptions), `#[serde]`, `#[schemars]`.
fn kept(attrs: &[Attribute]) -> impl Iterator<Item = &Attribute> {
    attrs.iter().filter(|a| {
        let p = a.path();
        p.is_ident("doc") || p.is_ident("serde") || p.is_ident("schemars")
    })
}

/// The mirror's container attributes: the user's, our crate path, the original name, and a
/// container `#[serde(default)]` pointed at the original type's `Default`.
fn mirror_container_attrs(input: &DeriveInput) -> syn::Result<Vec<TokenStream>> {
    let ident = &input.ident;
    let mut out = Vec::new();
    for attr in kept(&input.attrs) {
        let path = attr.path();
        if path.is_ident("doc") {
            out.push(quote!(#attr));
            continue;
        }
        let Ok(metas) = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
        else {
            out.push(quote!(#attr));
            continue;
        };
        let metas: Vec<Meta> = metas
            .into_iter()
            .filter(|m| !(path.is_ident("schemars") && m.path().is_ident("crate")))
            .map(|m| match m {
                Meta::Path(p) if p.is_ident("default") && matches!(input.data, Data::Struct(_)) => {
                    let default = LitStr::new(
                        &format!("<{ident} as ::core::default::Default>::default"),
                        p.span(),
                    );
                    syn::parse_quote!(default = #default)
                }
                m => m,
            })
            .collect();
        if !metas.is_empty() {
            out.push(quote!(#[#path(#(#metas),*)]));
        }
    }
    out.push(quote!(#[schemars(crate = "::ruststream::schemars")]));
    if !has_key(&input.attrs, &["rename"]) {
        let name = LitStr::new(&ident.to_string(), ident.span());
        out.push(quote!(#[schemars(rename = #name)]));
    }
    Ok(out)
}

/// The mirror struct or enum: same shape and field types (the type's own name, in a recursive
/// field, replaced by the mirror's), kept attributes only.
fn mirror_item(input: &DeriveInput, mirror: &Ident) -> syn::Result<TokenStream> {
    let original = &input.ident;
    match &input.data {
        Data::Struct(s) => {
            let fields = mirror_fields(&s.fields, original, mirror);
            let semi = if matches!(s.fields, Fields::Named(_)) {
                quote!()
            } else {
                quote!(;)
            };
            Ok(quote!(struct #mirror #fields #semi))
        }
        Data::Enum(e) => {
            let variants = e.variants.iter().map(|v| {
                let attrs = kept(&v.attrs);
                let vident = &v.ident;
                let fields = mirror_fields(&v.fields, original, mirror);
                let disc = v.discriminant.as_ref().map(|(eq, expr)| quote!(#eq #expr));
                quote!(#(#attrs)* #vident #fields #disc)
            });
            Ok(quote!(enum #mirror { #(#variants),* }))
        }
        Data::Union(u) => Err(Error::new(
            u.union_token.span(),
            "#[derive(Outgoing)] does not support unions: use a struct or an enum",
        )),
    }
}

fn mirror_fields(fields: &Fields, original: &Ident, mirror: &Ident) -> TokenStream {
    let one = |f: &syn::Field| {
        let attrs = kept(&f.attrs);
        let mut ty = f.ty.clone();
        replace_self(&mut ty, original, mirror);
        match &f.ident {
            Some(name) => quote!(#(#attrs)* #name: #ty),
            None => quote!(#(#attrs)* #ty),
        }
    };
    match fields {
        Fields::Named(n) => {
            let fs = n.named.iter().map(one);
            quote!({ #(#fs),* })
        }
        Fields::Unnamed(u) => {
            let fs = u.unnamed.iter().map(one);
            quote!(( #(#fs),* ))
        }
        Fields::Unit => quote!(),
    }
}

/// Replaces `Self` and the type's own name inside a field type with the mirror, so recursive
/// types (`children: Vec<Node>`) describe themselves.
fn replace_self(ty: &mut Type, original: &Ident, mirror: &Ident) {
    match ty {
        Type::Path(p) => {
            let alone =
                p.qself.is_none() && p.path.leading_colon.is_none() && p.path.segments.len() == 1;
            if let Some(seg) = p.path.segments.first_mut()
                && alone
                && (seg.ident == *original || seg.ident == "Self")
                && seg.arguments.is_none()
            {
                seg.ident = mirror.clone();
                return;
            }
            for seg in &mut p.path.segments {
                if let PathArguments::AngleBracketed(args) = &mut seg.arguments {
                    for arg in &mut args.args {
                        if let GenericArgument::Type(t) = arg {
                            replace_self(t, original, mirror);
                        }
                    }
                }
            }
        }
        Type::Reference(r) => replace_self(&mut r.elem, original, mirror),
        Type::Slice(s) => replace_self(&mut s.elem, original, mirror),
        Type::Array(a) => replace_self(&mut a.elem, original, mirror),
        Type::Paren(p) => replace_self(&mut p.elem, original, mirror),
        Type::Group(g) => replace_self(&mut g.elem, original, mirror),
        Type::Tuple(t) => t
            .elems
            .iter_mut()
            .for_each(|e| replace_self(e, original, mirror)),
        _ => {}
    }
}
