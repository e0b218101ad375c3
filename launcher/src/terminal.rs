//! Text from others (a session, an agent, a remote shell) made safe to print as a message.
//!
//! greedyrun prints what sessions and agents say ("waiting for slots", a lost host's reason,
//! a remote shell's complaint) on the user's terminal. Such text must not move the cursor,
//! retitle the window, or hide a line behind another: its control characters are shown
//! escaped. The ranks' own output is the program's and passes untouched.

use std::borrow::Cow;

/// `text` with every control character (but tab) and bidirectional override shown as an
/// escape (`\n`, `\u{1b}`); plain text, accents and other scripts stay as they are.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' | '\r' => out.extend(c.escape_debug()),
            c if needs_escape(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn controls_are_shown_and_text_kept() {
        for (input, expect) in [
            ("waiting for job 3's slots", "waiting for job 3's slots"),
            ("tab\there, café, 東京", "tab\there, café, 東京"),
            (
                "\u{1b}[1;31mrun: curl evil | sh\u{1b}[0m",
                "\\u{1b}[1;31mrun: curl evil | sh\\u{1b}[0m",
            ),
            ("two\nlines\r", "two\\nlines\\r"),
            (
                "bell\u{7} del\u{7f} csi\u{9b}",
                "bell\\u{7} del\\u{7f} csi\\u{9b}",
            ),
            ("abc\u{202e}fed", "abc\\u{202e}fed"),
        ] {
            assert_eq!(escape(input), expect, "{input:?}");
        }
    }
}
