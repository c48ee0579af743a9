//! Procedural macros of RustStream. Each entry point parses and expands; behaviour lives in the
//! runtime crates.

use proc_macro::TokenStream;

/// Placeholder until the macro crate lands.
#[proc_macro_attribute]
pub fn subscriber(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}

/// Placeholder until the macro crate lands.
#[proc_macro_attribute]
pub fn app(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}

/// Placeholder until the macro crate lands.
#[proc_macro_derive(Outgoing, attributes(outgoing))]
pub fn derive_outgoing(_item: TokenStream) -> TokenStream {
    TokenStream::new()
}
