//! Text that came from the node (process names, cgroup paths, the runtime's labels and
//! messages) made safe for a terminal or a one-line log: control characters and the Unicode
//! controls that reorder or hide text are written as escapes, so a name cannot move the cursor,
//! clear a screen, recolour a table or forge a line. JSON outputs carry the raw value instead
//! (JSON escapes it).
use std::fmt::{self, Write};

/// `Printable(s)` displays `s` with C0 controls (newlines and tabs included), DEL, C1 controls
/// and the bidirectional and zero-width format characters escaped as `\xNN` / `\u{NNNN}`.
#[derive(Clone, Copy, Debug)]
pub struct Printable<'a>(pub &'a str);

/// Whether a character is written as an escape.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            // Bidirectional embeddings, overrides and isolates (the "Trojan Source" set), the
            // zero-width ones and the BOM: invisible, they make a name read as another.
            '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Through `pad`, so table widths and alignment apply to the escaped text.
        f.pad(&printable(self.0))
    }
}

fn escape_into(out: &mut String, s: &str) {
    let mut rest = s;
    while let Some(i) = rest.find(unsafe_char) {
        out.push_str(&rest[..i]);
        let c = rest[i..].chars().next().expect("found");
        let _ = if (c as u32) < 0x100 {
            write!(out, "\\x{:02x}", c as u32)
        } else {
            write!(out, "\\u{{{:04x}}}", c as u32)
        };
        rest = &rest[i + c.len_utf8()..];
    }
    out.push_str(rest);
}

/// [`Printable`] as an owned string, borrowed when nothing needed escaping.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(unsafe_char) {
        let mut out = String::with_capacity(s.len() + 8);
        escape_into(&mut out, s);
        out.into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_reordering_marks_are_escaped_and_the_rest_kept() {
        assert_eq!(printable("nginx: worker"), "nginx: worker");
        assert!(matches!(printable("plain"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(printable("x\ny\rz\t"), "x\\x0ay\\x0dz\\x09");
        assert_eq!(printable("\u{7f}\u{9b}"), "\\x7f\\x9b");
        assert_eq!(printable("evil\u{202e}gpj.exe"), "evil\\u{202e}gpj.exe");
        assert_eq!(printable("zero\u{200b}width"), "zero\\u{200b}width");
        assert_eq!(printable("ünïcödé 名前"), "ünïcödé 名前");
        assert_eq!(format!("[{:>6}]", Printable("a\x07")), "[ a\\x07]");
    }
}
