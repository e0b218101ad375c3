//! Which of greedyrun's variables the ranks get, with the options users bring from other
//! launchers: everything by default (as Hydra's `-genvall`, Open MPI and srun's `ALL`); Open
//! MPI's `-x VAR[=VAL]`; Hydra's `-genv VAR VAL`, `-genvlist A,B` and `-genvnone`; srun's
//! `--export=ALL|NONE|[ALL,]VAR[=VAL],…`.
//!
//! Which variables are passed on ([`Base`]) is decided by `--export` if given, else
//! `-genvlist`, else `-genvnone`; every `VAR=VAL` given anywhere is set on top, and every bare
//! `VAR` (`-x VAR`, a name in `--export`) is passed on even under `NONE` or a list. The
//! variables greedy sets itself (rank, size, the wire-up's) are added later and always win.

use crate::Error;

/// Which of greedyrun's own variables reach the ranks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Base {
    /// Every variable (the default).
    #[default]
    All,
    /// None of them.
    None,
    /// Only these.
    List(Vec<String>),
}

/// The rank environment's rules, as the command line gave them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Exports {
    /// Which variables are passed on.
    pub base: Base,
    /// Variables passed on whatever the base says (`-x VAR`, names in `--export`).
    pub pass: Vec<String>,
    /// Variables set to a value (`-x VAR=VAL`, `-genv`, `--export VAR=VAL`), in order.
    pub set: Vec<(String, String)>,
}

impl Exports {
    /// `-x VAR` or `-x VAR=VAL` (Open MPI).
    pub fn x(&mut self, arg: &str) -> Result<(), Error> {
        match arg.split_once('=') {
            Some((name, value)) => self
                .set
                .push((checked_name(name, "-x")?, value.to_string())),
            None => self.pass.push(checked_name(arg, "-x")?),
        }
        Ok(())
    }

    /// `-genv VAR VAL` (Hydra).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), Error> {
        self.set
            .push((checked_name(name, "-genv")?, value.to_string()));
        Ok(())
    }

    /// `-genvlist A,B` (Hydra): only these.
    pub fn list(&mut self, names: &str) -> Result<(), Error> {
        let names = names
            .split(',')
            .filter(|n| !n.is_empty())
            .map(|n| checked_name(n, "-genvlist"))
            .collect::<Result<_, _>>()?;
        self.base = Base::List(names);
        Ok(())
    }

    /// `--export=ALL|NONE|[ALL,]VAR[=VAL],…` (srun): a list without `ALL` passes on only
    /// what it names.
    pub fn export(&mut self, spec: &str) -> Result<(), Error> {
        let mut items: Vec<&str> = spec.split(',').filter(|i| !i.is_empty()).collect();
        match items.first().map(|i| i.to_ascii_uppercase()).as_deref() {
            Some("ALL") => {
                self.base = Base::All;
                items.remove(0);
            }
            Some("NONE") => {
                self.base = Base::None;
                items.remove(0);
            }
            Some(_) => self.base = Base::None,
            None => {
                return Err(Error::Plan(
                    "--export: empty (ALL, NONE or VAR[=VAL],…)".into(),
                ));
            }
        }
        for item in items {
            match item.split_once('=') {
                Some((name, value)) => self
                    .set
                    .push((checked_name(name, "--export")?, value.to_string())),
                None => self.pass.push(checked_name(item, "--export")?),
            }
        }
        Ok(())
    }

    /// The ranks' variables from greedyrun's own (`env`, in order).
    pub fn apply(&self, env: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| match &self.base {
                Base::All => true,
                Base::None => self.pass.contains(k),
                Base::List(names) => names.contains(k) || self.pass.contains(k),
            })
            .collect();
        for (k, v) in &self.set {
            out.retain(|(o, _)| o != k);
            out.push((k.clone(), v.clone()));
        }
        out
    }
}

/// A variable name as a shell would take it: `[A-Za-z_][A-Za-z0-9_]*`.
fn checked_name(name: &str, option: &str) -> Result<String, Error> {
    let ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(name.to_string())
    } else {
        Err(Error::Plan(format!(
            "{option} {name:?}: not a variable name"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Vec<(String, String)> {
        [("A", "1"), ("B", "2"), ("C", "3")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .to_vec()
    }

    fn names(v: &[(String, String)]) -> Vec<String> {
        v.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn everything_by_default_with_values_set_on_top() {
        let mut e = Exports::default();
        e.x("B=9").unwrap();
        e.x("A").unwrap();
        e.set("D", "x y").unwrap();
        assert_eq!(names(&e.apply(env())), ["A=1", "C=3", "B=9", "D=x y"]);
    }

    #[test]
    fn lists_none_and_srun_export() {
        let mut e = Exports::default();
        e.list("A,C").unwrap();
        assert_eq!(names(&e.apply(env())), ["A=1", "C=3"]);
        let mut e = Exports::default();
        e.export("NONE").unwrap();
        e.x("B").unwrap();
        assert_eq!(names(&e.apply(env())), ["B=2"]);
        let mut e = Exports::default();
        e.export("C,E=5").unwrap();
        assert_eq!(names(&e.apply(env())), ["C=3", "E=5"]);
        let mut e = Exports::default();
        e.export("all,A=0").unwrap();
        assert_eq!(names(&e.apply(env())), ["B=2", "C=3", "A=0"]);
    }

    #[test]
    fn bad_names_are_refused_with_the_option() {
        let mut e = Exports::default();
        for (r, opt) in [
            (e.x("1A=2"), "-x"),
            (e.set("A-B", "1"), "-genv"),
            (e.list("A,$B"), "-genvlist"),
            (e.export("ALL,=1"), "--export"),
            (e.export(""), "--export"),
        ] {
            let msg = r.unwrap_err().to_string();
            assert!(msg.contains(opt), "{msg}");
        }
    }
}
