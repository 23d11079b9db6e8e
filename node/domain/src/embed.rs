//! Embeddings: texts in, one vector per text out. The front door, the model backends and
//! `agentmesh.v1.Models/Embed` (as protobuf messages, converted in `mesh-proto`) all speak
//! these; what a request may hold is checked here once, so every way in refuses the
//! same things with the same words.

use serde::{Deserialize, Serialize};

/// Texts to embed: what the front door's `input` becomes, and what travels between nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbedRequest {
    /// The texts, each embedded on its own; the answer keeps their order.
    pub inputs: Vec<String>,
}

impl EmbedRequest {
    /// Most texts in one request (OpenAI's own limit).
    pub const MAX_INPUTS: usize = 2048;
    /// Longest text in bytes: no model this mesh runs embeds more than 8,192 tokens at once,
    /// and a token is rarely more than a few bytes, so anything longer is refused before any
    /// model tokenizes it.
    pub const MAX_INPUT_BYTES: usize = 32 * 1024;

    /// Checks the count and the sizes; the error starts with the field's name (`input`).
    pub fn check(&self) -> Result<(), String> {
        if self.inputs.is_empty() {
            return Err("input: give at least one text".into());
        }
        if self.inputs.len() > Self::MAX_INPUTS {
            return Err(format!(
                "input: {} texts, at most {} in one request; split the list",
                self.inputs.len(),
                Self::MAX_INPUTS
            ));
        }
        if let Some(i) = self.inputs.iter().position(String::is_empty) {
            return Err(format!("input[{i}]: the text is empty"));
        }
        if let Some(i) = self
            .inputs
            .iter()
            .position(|text| text.len() > Self::MAX_INPUT_BYTES)
        {
            return Err(format!(
                "input[{i}]: {} bytes, at most {} per text; split it",
                self.inputs[i].len(),
                Self::MAX_INPUT_BYTES
            ));
        }
        Ok(())
    }

    /// At most how many tokens the texts are: no token of less than one byte (see
    /// [`crate::chat::prompt_token_bound`]), plus the two a model adds around each text.
    pub fn token_bound(&self) -> u64 {
        self.inputs.iter().map(|text| text.len() as u64 + 2).sum()
    }

    /// A guess of the texts' tokens (four bytes a token), for a model that reported none.
    pub fn estimated_tokens(&self) -> u64 {
        self.inputs
            .iter()
            .map(|text| crate::chat::estimate_text_tokens(text.len()) + 2)
            .sum()
    }
}

/// A model's embeddings of one [`EmbedRequest`]; between nodes it travels in
/// `agentmesh.v1.Models/Embed`'s answer, each vector a `repeated float`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EmbedResponse {
    /// The configured name of the model that made them.
    pub model: String,
    /// One vector per input, in the inputs' order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens of all inputs together.
    pub prompt_tokens: u64,
}

/// Scales `vector` to unit length (as OpenAI's embeddings are), so a dot product is the cosine
/// similarity; a zero vector stays zero.
pub fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(inputs: &[&str]) -> EmbedRequest {
        EmbedRequest {
            inputs: inputs.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn inputs_are_bounded_in_count_and_size_and_the_error_names_the_input() {
        assert_eq!(request(&["a", "b"]).check(), Ok(()));
        let empty = request(&[]).check().expect_err("no inputs");
        assert!(empty.starts_with("input:"), "{empty}");
        let blank = request(&["a", ""]).check().expect_err("empty text");
        assert!(blank.starts_with("input[1]:"), "{blank}");
        let many = EmbedRequest {
            inputs: vec!["x".into(); EmbedRequest::MAX_INPUTS + 1],
        };
        let error = many.check().expect_err("too many");
        assert!(error.contains("at most 2048"), "{error}");
        assert_eq!(
            EmbedRequest {
                inputs: vec!["x".into(); EmbedRequest::MAX_INPUTS]
            }
            .check(),
            Ok(())
        );
        let long = "y".repeat(EmbedRequest::MAX_INPUT_BYTES + 1);
        let error = request(&["a", "b", &long]).check().expect_err("too long");
        assert!(error.starts_with("input[2]:"), "{error}");
    }

    #[test]
    fn normalized_vectors_have_unit_length_and_zero_stays_zero() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut zero = vec![0.0; 3];
        normalize(&mut zero);
        assert_eq!(zero, vec![0.0; 3]);
    }
}
