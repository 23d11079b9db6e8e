//! OpenAI's `cl100k_base` tokenizer (tiktoken-rs, which carries its ranks), loaded on first use:
//! it turns the token-id arrays some OpenAI clients send as embeddings input back into text
//! (langchain's `OpenAIEmbeddings` sends cl100k ids by default), and it gives Anthropic's
//! `count_tokens` its estimate. It is nobody's serving model's tokenizer: a count made with it
//! is an estimate, and ids are only ever decoded to text, which the serving model tokenizes
//! its own way. Loading takes a moment and some 20 MB, so only a node whose clients need it
//! pays; callers run it off the async runtime ([`decode`] and [`count`] block).

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

/// The tokenizer, or why it could not be built (it is built from data inside the binary, so
/// this is not expected).
static CL100K: OnceLock<Result<CoreBPE, String>> = OnceLock::new();

fn tokenizer() -> Result<&'static CoreBPE, String> {
    CL100K
        .get_or_init(|| tiktoken_rs::cl100k_base().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| format!("the cl100k_base tokenizer did not load: {e}"))
}

/// Why token ids did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum DecodeError {
    /// An id that is no token of cl100k_base.
    #[error("{0} is not a token id of cl100k_base")]
    UnknownId(u32),
    /// The tokenizer is not there.
    #[error("{0}")]
    Unavailable(String),
}

/// The text `ids` (cl100k_base token ids) stand for; bytes that are not UTF-8 (ids that cut a
/// character in two) become U+FFFD.
pub(super) fn decode(ids: &[u32]) -> Result<String, DecodeError> {
    let bytes = tokenizer()
        .map_err(DecodeError::Unavailable)?
        .decode_bytes(ids)
        .map_err(|e| DecodeError::UnknownId(e.token))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// How many cl100k_base tokens `text` is (special tokens' text counted as ordinary text).
pub(super) fn count(text: &str) -> Result<usize, String> {
    Ok(tokenizer()?.encode_ordinary(text).len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids OpenAI's own tiktoken gives "hello world" (`[15339, 1917]`) decode back, and a
    /// count agrees with them.
    #[test]
    fn ids_decode_to_their_text_and_unknown_ids_are_named() {
        assert_eq!(decode(&[15339, 1917]).expect("decodes"), "hello world");
        assert_eq!(count("hello world"), Ok(2));
        assert_eq!(
            decode(&[15339, 999_999]),
            Err(DecodeError::UnknownId(999_999))
        );
        assert_eq!(decode(&[]).expect("empty"), "");
    }
}
