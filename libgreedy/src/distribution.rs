//! A process distribution (LIBI's): groups of hosts, each running its own program with its
//! own arguments and environment, `count` processes per host. Ranks follow the groups' order,
//! each host's processes consecutive.

use greedy_tree::hostname;

use crate::error::{Error, Result};

/// Hosts running one program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGroup {
    /// The program (a path, or a name looked up on the hosts' PATH).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables set for it, besides the launcher's environment.
    pub env: Vec<(String, String)>,
    /// Each host with its number of processes; empty: every node of the back end's job or
    /// allocation, one process each.
    pub hosts: Vec<(String, u32)>,
}

impl HostGroup {
    /// `program` with no arguments on no host yet.
    pub fn new(program: impl Into<String>) -> HostGroup {
        HostGroup {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            hosts: Vec::new(),
        }
    }

    /// The number of processes it starts (0 when its hosts come from the back end).
    pub fn processes(&self) -> u32 {
        self.hosts.iter().map(|(_, n)| n).sum()
    }
}

/// The whole distribution, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distribution {
    groups: Vec<HostGroup>,
    bcast: Vec<String>,
}

impl Distribution {
    /// Checks the groups: at least one; host names that are names (never options or shell
    /// syntax); counts above 0; variable names that are names; hosts left to the back end
    /// only in a distribution of one group.
    pub fn new(groups: Vec<HostGroup>) -> Result<Distribution> {
        if groups.is_empty() {
            return Err(Error::Distribution("no host group".into()));
        }
        for (g, group) in groups.iter().enumerate() {
            check_group(g, group)?;
            if group.hosts.is_empty() && groups.len() > 1 {
                return Err(Error::Distribution(format!(
                    "group {g} names no host: only a distribution of one group may leave its hosts to the back end"
                )));
            }
        }
        Ok(Distribution {
            groups,
            bcast: Vec::new(),
        })
    }

    /// Also copies `files` to node-local storage on every host before the members start,
    /// down the launch tree (greedyrun's `--bcast`); members find them in `$GREEDY_BCAST`. A
    /// group's program among them runs from its copy. Only the greedyrun back ends do this.
    pub fn with_bcast(mut self, files: Vec<String>) -> Result<Distribution> {
        for f in &files {
            if f.is_empty() || f.contains(',') {
                return Err(Error::Distribution(format!(
                    "broadcast file {f:?}: empty, or a comma in its name"
                )));
            }
        }
        self.bcast = files;
        Ok(self)
    }

    /// The files broadcast before the members start.
    pub fn bcast(&self) -> &[String] {
        &self.bcast
    }

    /// The groups in rank order.
    pub fn groups(&self) -> &[HostGroup] {
        &self.groups
    }

    /// Whether the back end chooses the hosts.
    pub fn hosts_from_back_end(&self) -> bool {
        self.groups[0].hosts.is_empty()
    }

    /// Every host with its count, in rank order (a host in two groups appears twice).
    pub fn hosts(&self) -> Vec<(String, u32)> {
        self.groups.iter().flat_map(|g| g.hosts.clone()).collect()
    }

    /// The same distribution with `hosts` (one process each) for a group that named none.
    pub fn on_hosts(&self, hosts: &[String]) -> Distribution {
        let mut groups = self.groups.clone();
        if groups[0].hosts.is_empty() {
            groups[0].hosts = hosts.iter().map(|h| (h.clone(), 1)).collect();
        }
        Distribution {
            groups,
            bcast: self.bcast.clone(),
        }
    }

    /// The program every rank runs: itself when there is one group, else a `sh -c` script
    /// that execs the group of `$PMI_RANK` (every back end serves members PMI-1).
    pub fn command(&self) -> Vec<String> {
        if let [group] = self.groups.as_slice() {
            let mut argv = Vec::new();
            if !group.env.is_empty() {
                argv.push("env".to_string());
                argv.extend(group.env.iter().map(|(k, v)| format!("{k}={v}")));
                argv.push("--".into());
            }
            argv.push(group.program.clone());
            argv.extend(group.args.iter().cloned());
            return argv;
        }
        vec!["/bin/sh".into(), "-c".into(), self.script()]
    }

    /// `if [ "$PMI_RANK" -lt END ]; then exec env … PROGRAM ARGS; fi` per group.
    fn script(&self) -> String {
        let mut script = String::new();
        let mut end = 0;
        for group in &self.groups {
            end += group.processes();
            let mut words = vec!["env".to_string()];
            words.extend(group.env.iter().map(|(k, v)| quote(&format!("{k}={v}"))));
            words.push("--".into());
            words.push(quote(&group.program));
            words.extend(group.args.iter().map(|a| quote(a)));
            script.push_str(&format!(
                "if [ \"$PMI_RANK\" -lt {end} ]; then exec {}; fi\n",
                words.join(" ")
            ));
        }
        script.push_str("echo \"libgreedy: rank $PMI_RANK is in no host group\" >&2; exit 127\n");
        script
    }
}

fn check_group(g: usize, group: &HostGroup) -> Result<()> {
    if group.program.is_empty() {
        return Err(Error::Distribution(format!("group {g} names no program")));
    }
    for (host, count) in &group.hosts {
        hostname::check(host).map_err(|why| Error::Distribution(format!("group {g}: {why}")))?;
        if *count == 0 {
            return Err(Error::Distribution(format!(
                "group {g}: host {host} runs 0 processes"
            )));
        }
    }
    for (name, _) in &group.env {
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(Error::Distribution(format!(
                "group {g}: {name:?} is not a variable name"
            )));
        }
    }
    Ok(())
}

/// One shell word holding `s` as it is.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(program: &str, hosts: &[(&str, u32)]) -> HostGroup {
        HostGroup {
            hosts: hosts.iter().map(|(h, n)| (h.to_string(), *n)).collect(),
            ..HostGroup::new(program)
        }
    }

    #[test]
    fn one_group_runs_its_program_directly() {
        let mut g = group("tool", &[("n1", 2)]);
        g.args = vec!["a b".into()];
        let d = Distribution::new(vec![g.clone()]).unwrap();
        assert_eq!(d.command(), ["tool", "a b"]);
        g.env = vec![("X".into(), "1".into())];
        let d = Distribution::new(vec![g]).unwrap();
        assert_eq!(d.command(), ["env", "X=1", "--", "tool", "a b"]);
    }

    #[test]
    fn groups_exec_by_rank_and_quote_every_word() {
        let mut a = group("/bin/fe'd", &[("n1", 2), ("n2", 1)]);
        a.args = vec!["$HOME".into()];
        let b = group("b", &[("n3", 1)]);
        let d = Distribution::new(vec![a, b]).unwrap();
        let script = &d.command()[2];
        assert!(script.contains(r#"-lt 3 ]; then exec env -- '/bin/fe'\''d' '$HOME'; fi"#));
        assert!(script.contains(r#"-lt 4 ]; then exec env -- 'b'; fi"#));
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", script])
            .env("PMI_RANK", "3")
            .env("PATH", "/nonexistent")
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("b"),
            "{out:?}"
        );
        assert_eq!(
            d.hosts(),
            [("n1".into(), 2), ("n2".into(), 1), ("n3".into(), 1)]
        );
    }

    #[test]
    fn bad_distributions_are_refused_naming_the_group() {
        let err = |groups| Distribution::new(groups).unwrap_err().to_string();
        assert!(err(vec![]).contains("no host group"));
        assert!(err(vec![group("t", &[("-oProxy", 1)])]).contains("group 0"));
        assert!(err(vec![group("t", &[("n1", 0)])]).contains("n1 runs 0"));
        assert!(err(vec![group("t", &[("n1", 1)]), group("u", &[])]).contains("group 1"));
        let mut g = group("t", &[("n1", 1)]);
        g.env = vec![("A=B".into(), "1".into())];
        assert!(err(vec![g]).contains("not a variable name"));
    }
}
