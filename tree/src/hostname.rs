//! What a host name may be: an RFC 1123 name, or an IPv4 or IPv6 literal.
//!
//! Every host a launcher hands to a remote shell passes here first, so that nothing read from
//! a hostfile or a command line can be taken for an option (`-oProxyCommand=…`) or carry
//! shell syntax.

use std::net::IpAddr;

/// Checks `name`; the error says what is wrong with it.
///
/// ```
/// use greedy_tree::hostname::check;
/// assert!(check("n1.cluster-a").is_ok() && check("10.0.0.1").is_ok() && check("fe80::1").is_ok());
/// assert!(check("-oProxyCommand=sh").is_err() && check("a;b").is_err());
/// ```
pub fn check(name: &str) -> Result<(), String> {
    if name.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    if name.is_empty() || name.len() > 253 {
        return Err(format!(
            "a host name has 1 to 253 characters, not {}",
            name.len()
        ));
    }
    for label in name.strip_suffix('.').unwrap_or(name).split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!(
                "each dot-separated part of a host name has 1 to 63 characters: {label:?}"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "a host name part cannot begin or end with '-': {label:?}"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(format!(
                "{c:?} is not allowed in a host name (letters, digits, '-' and '.' only)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_literals_pass() {
        for ok in [
            "n1",
            "node-01.rack3.example.org",
            "localhost",
            "a.",
            "127.0.0.1",
            "::1",
            "2001:db8::7",
            "1n",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn options_and_shell_syntax_fail() {
        for bad in [
            "-oProxyCommand=touch /tmp/x",
            "-l",
            "n1 n2",
            "a;b",
            "$(id)",
            "`id`",
            "n1'",
            "",
            "a..b",
            "n1-",
            "user@host",
            "n\u{00e9}",
        ] {
            assert!(check(bad).is_err(), "{bad:?} passed");
        }
        assert!(check(&"a".repeat(64)).is_err());
        assert!(check(&["a"; 128].join(".")).is_err());
    }
}
