//! The answer as it is decoded: token bytes become text deltas, whole characters only, cut at
//! the first stop string (ChatML's turn markers or the caller's), none of it sent before it is
//! known not to be the start of one. No model.

/// Text that ends a turn even when the model writes it as plain text rather than as its special
/// token: the ChatML turn markers and the end-of-text marker.
pub(super) const STOP_STRINGS: &[&str] = &["<|im_end|>", "<|im_start|>", "<|endoftext|>"];

/// What [`TextStream::push`] produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct StreamStep {
    /// Text that is final and may be sent as a delta (possibly empty).
    pub text: String,
    /// A stop string was reached: generation is over, the stop string is not part of the text.
    pub stopped: bool,
}

/// Turns decoded token bytes into text deltas: holds back incomplete UTF-8 sequences (a
/// character may span tokens) and anything that could be the start of a stop string, and cuts
/// the answer at the first stop string.
#[derive(Debug, Default)]
pub(super) struct TextStream {
    /// Bytes not yet sent: an incomplete character or a possible stop-string prefix.
    pending: Vec<u8>,
    /// Set once a stop string was seen; later input is ignored.
    stopped: bool,
    /// The caller's stop strings, besides [`STOP_STRINGS`].
    extra: Vec<String>,
}

impl TextStream {
    /// A stream that also stops at the caller's `stops` (empty ones are ignored).
    pub(super) fn with_stops(stops: &[String]) -> Self {
        Self {
            extra: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Self::default()
        }
    }

    fn stops(&self) -> impl Iterator<Item = &str> {
        STOP_STRINGS
            .iter()
            .copied()
            .chain(self.extra.iter().map(String::as_str))
    }

    /// Adds the bytes of one token.
    pub(super) fn push(&mut self, bytes: &[u8]) -> StreamStep {
        if self.stopped {
            return StreamStep {
                text: String::new(),
                stopped: true,
            };
        }
        self.pending.extend_from_slice(bytes);
        // Only complete characters can be judged; an incomplete tail waits for the next token.
        let valid = repair_utf8(&mut self.pending);
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        if let Some(at) = self.stops().filter_map(|s| text.find(s)).min() {
            self.stopped = true;
            self.pending.clear();
            return StreamStep {
                text: text[..at].to_owned(),
                stopped: true,
            };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let hold = self
            .stops()
            .flat_map(|stop| (1..stop.len()).filter_map(move |n| stop.get(..n)))
            .filter(|prefix| text.ends_with(prefix))
            .map(|prefix| prefix.len())
            .max()
            .unwrap_or(0);
        let send = text.len() - hold;
        let out = text[..send].to_owned();
        self.pending.drain(..send);
        StreamStep {
            text: out,
            stopped: false,
        }
    }

    /// Ends the stream: whatever was held back is final (an incomplete character becomes U+FFFD).
    pub(super) fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// Replaces invalid byte sequences in `bytes` with U+FFFD, leaving an incomplete character at
/// the end alone; returns the length of the complete, valid prefix.
fn repair_utf8(bytes: &mut Vec<u8>) -> usize {
    let mut start = 0;
    loop {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(_) => return bytes.len(),
            Err(e) => {
                let at = start + e.valid_up_to();
                match e.error_len() {
                    None => return at,
                    Some(n) => {
                        bytes.splice(at..at + n, "\u{fffd}".bytes());
                        start = at + "\u{fffd}".len();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stream: &mut TextStream, pieces: &[&[u8]]) -> (String, bool) {
        let mut out = String::new();
        let mut stopped = false;
        for piece in pieces {
            let step = stream.push(piece);
            out.push_str(&step.text);
            stopped |= step.stopped;
            if stopped {
                break;
            }
        }
        if !stopped {
            out.push_str(&stream.finish());
        }
        (out, stopped)
    }

    #[test]
    fn generation_stops_at_im_end_even_when_split_across_tokens() {
        let mut stream = TextStream::default();
        let (text, stopped) = run(
            &mut stream,
            &[b"Paris", b".<|im", b"_end", b"|>", b"\n<|im_start|>user"],
        );
        assert!(stopped);
        assert_eq!(text, "Paris.");
        // Nothing after the stop string leaks out.
        assert_eq!(stream.push(b"more").text, "");
        assert_eq!(stream.finish(), "");
    }

    #[test]
    fn a_callers_stop_string_ends_the_answer_even_split_and_multibyte() {
        let mut stream = TextStream::with_stops(&["Ende€".into(), String::new()]);
        let euro = "€".as_bytes();
        let (text, stopped) = run(&mut stream, &[b"Paris. En", b"de", &euro[..2], &euro[2..]]);
        assert!(stopped);
        assert_eq!(text, "Paris. ");
        // A held-back prefix that does not complete the stop string is sent after all.
        let mut stream = TextStream::with_stops(&["END".into()]);
        let (text, stopped) = run(&mut stream, &[b"EN", b"D?", b"no: ENJOY"]);
        assert!(stopped);
        assert_eq!(text, "");
        let mut stream = TextStream::with_stops(&["END".into()]);
        let (text, stopped) = run(&mut stream, &[b"EN", b"JOY"]);
        assert!(!stopped);
        assert_eq!(text, "ENJOY");
    }

    #[test]
    fn other_stop_strings_end_the_answer_too() {
        for stop in STOP_STRINGS {
            let mut stream = TextStream::default();
            let (text, stopped) = run(&mut stream, &[b"a ", stop.as_bytes(), b"b"]);
            assert!(stopped, "{stop}");
            assert_eq!(text, "a ", "{stop}");
        }
    }

    #[test]
    fn a_possible_stop_prefix_is_held_back_then_released() {
        let mut stream = TextStream::default();
        let step = stream.push(b"1 <");
        assert_eq!(step.text, "1 ");
        let step = stream.push(b"|im");
        assert_eq!(step.text, "");
        // Not a stop string after all.
        let step = stream.push(b"pressive");
        assert_eq!(step.text, "<|impressive");
        assert!(!step.stopped);
        let mut stream = TextStream::default();
        assert_eq!(stream.push(b"a <|").text, "a ");
        assert_eq!(stream.finish(), "<|");
    }

    #[test]
    fn characters_split_across_tokens_are_sent_whole() {
        let bytes = "é€".as_bytes();
        let mut stream = TextStream::default();
        assert_eq!(stream.push(&bytes[..1]).text, "");
        assert_eq!(stream.push(&bytes[1..3]).text, "é");
        assert_eq!(stream.push(&bytes[3..]).text, "€");
        // Invalid bytes do not wedge the stream.
        let (text, _) = run(&mut TextStream::default(), &[b"a\xff", b"b"]);
        assert_eq!(text, "a\u{fffd}b");
        // An incomplete character at the end becomes a replacement character.
        let (text, _) = run(&mut TextStream::default(), &[b"ok", &bytes[..1]]);
        assert_eq!(text, "ok\u{fffd}");
    }
}
