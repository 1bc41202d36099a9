//! A WordLevel tokenizer (HF `tokenizers`) for the sorting task, so prompts and
//! responses display as text (`"3 1 0 2"`). Token id `k` is the number `k`; the
//! special tokens follow the numbers. Saved as `assets/sort-tokenizer.json` and
//! compiled in: loading it never touches the network or the file system.

use tokenizers::Tokenizer;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;

/// Largest number the tokenizer knows, plus one (`task.vocab` must not exceed it).
pub const MAX_NUMBERS: u32 = 1024;
pub const EOS: &str = "<eos>";
pub const PAD: &str = "<pad>";
pub const UNK: &str = "<unk>";
pub const EOS_ID: u32 = MAX_NUMBERS;
pub const PAD_ID: u32 = MAX_NUMBERS + 1;
pub const UNK_ID: u32 = MAX_NUMBERS + 2;

const ASSET: &str = include_str!("../../assets/sort-tokenizer.json");

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer: {0}")]
    Inner(String),
    #[error("`{token}` is not a number token of the sorting tokenizer")]
    NotANumber { token: String },
}

/// The sorting tokenizer.
#[derive(Clone)]
pub struct SortTokenizer {
    inner: Tokenizer,
}

impl std::fmt::Debug for SortTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SortTokenizer")
    }
}

impl SortTokenizer {
    /// Build the tokenizer from scratch (what `assets/sort-tokenizer.json` holds).
    pub fn build() -> Result<Self, TokenizerError> {
        let mut vocab = ahash::AHashMap::new();
        for k in 0..MAX_NUMBERS {
            vocab.insert(k.to_string(), k);
        }
        vocab.insert(EOS.into(), EOS_ID);
        vocab.insert(PAD.into(), PAD_ID);
        vocab.insert(UNK.into(), UNK_ID);
        let model = WordLevel::builder()
            .vocab(vocab)
            .unk_token(UNK.into())
            .build()
            .map_err(|e| TokenizerError::Inner(e.to_string()))?;
        let mut inner = Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(WhitespaceSplit));
        Ok(Self { inner })
    }

    /// The compiled-in asset.
    pub fn load() -> Result<Self, TokenizerError> {
        let inner: Tokenizer =
            ASSET
                .parse()
                .map_err(|e: Box<dyn std::error::Error + Send + Sync>| {
                    TokenizerError::Inner(e.to_string())
                })?;
        Ok(Self { inner })
    }

    pub fn to_json(&self) -> String {
        self.inner.to_string(true).expect("tokenizer serializes")
    }

    /// `"3 1 0 2"` → `[3, 1, 0, 2]`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Inner(e.to_string()))?;
        if let Some(pos) = enc.get_ids().iter().position(|&id| id >= MAX_NUMBERS) {
            return Err(TokenizerError::NotANumber {
                token: enc.get_tokens()[pos].clone(),
            });
        }
        Ok(enc.get_ids().to_vec())
    }

    /// `[3, 1, 0, 2]` → `"3 1 0 2"`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let tokens: Vec<String> = ids
            .iter()
            .map(|&id| {
                self.inner
                    .id_to_token(id)
                    .unwrap_or_else(|| UNK.to_string())
            })
            .collect();
        tokens.join(" ")
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asset_is_what_the_builder_makes() {
        let built = SortTokenizer::build().unwrap();
        let loaded = SortTokenizer::load().unwrap();
        assert_eq!(
            built.to_json(),
            loaded.to_json(),
            "regenerate assets/sort-tokenizer.json: cargo test -- --ignored write_tokenizer_asset"
        );
    }

    #[test]
    fn round_trip() {
        let t = SortTokenizer::load().unwrap();
        assert_eq!(t.encode("3 1 0 2").unwrap(), vec![3, 1, 0, 2]);
        assert_eq!(t.decode(&[0, 1, 2, 3]), "0 1 2 3");
        assert_eq!(t.decode(&[4, EOS_ID]), "4 <eos>");
        assert!(t.encode("3 x").is_err());
        assert_eq!(t.vocab_size(), MAX_NUMBERS as usize + 3);
    }

    #[test]
    #[ignore]
    fn write_tokenizer_asset() {
        let json = SortTokenizer::build().unwrap().to_json();
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sort-tokenizer.json"),
            json,
        )
        .unwrap();
    }
}
