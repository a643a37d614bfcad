//! Child environment construction (docs/protocol.md, "Environment").
//!
//! Without `envPolicy` the child gets exactly `env`. With one, the starting
//! set comes from the *tenant's base environment* (never the gateway's own,
//! which holds secrets), filtered as the Codex shell-environment policy does,
//! and `env` is laid over the result.

use std::collections::HashMap;

use crate::protocol::process::{EnvInherit, EnvPolicy};

/// Variables kept by `inherit: "core"`.
const CORE_VARS: &[&str] = &[
    "PATH", "SHELL", "TMPDIR", "TEMP", "TMP", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LOGNAME",
    "USER",
];

/// Dropped unless `ignoreDefaultExcludes` (case-insensitive globs).
const DEFAULT_EXCLUDES: &[&str] = &["*KEY*", "*SECRET*", "*TOKEN*"];

/// Build the child environment.
pub fn child_env(
    env: &HashMap<String, String>,
    policy: Option<&EnvPolicy>,
    base: &HashMap<String, String>,
) -> HashMap<String, String> {
    let Some(policy) = policy else {
        return env.clone();
    };
    let mut out: HashMap<String, String> = match policy.inherit {
        EnvInherit::All => base.clone(),
        EnvInherit::Core => base
            .iter()
            .filter(|(k, _)| CORE_VARS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        EnvInherit::None => HashMap::new(),
    };
    if !policy.ignore_default_excludes {
        out.retain(|k, _| !DEFAULT_EXCLUDES.iter().any(|g| glob_match(g, k)));
    }
    out.retain(|k, _| !policy.exclude.iter().any(|g| glob_match(g, k)));
    for (k, v) in &policy.set {
        out.insert(k.clone(), v.clone());
    }
    if !policy.include_only.is_empty() {
        out.retain(|k, _| policy.include_only.iter().any(|g| glob_match(g, k)));
    }
    for (k, v) in env {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// Case-insensitive glob with `*` and `?`.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.to_ascii_uppercase().chars().collect();
    let t: Vec<char> = text.to_ascii_uppercase().chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn globs() {
        assert!(glob_match("*KEY*", "api_key"));
        assert!(glob_match("A?C", "abc"));
        assert!(!glob_match("A?C", "abbc"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("X*", "YX"));
    }

    #[test]
    fn exact_env_without_policy() {
        let env = map(&[("ONLY", "1")]);
        assert_eq!(child_env(&env, None, &map(&[("PATH", "/bin")])), env);
    }

    #[test]
    fn core_policy_with_overlay_wins() {
        let base = map(&[("HOME", "/root"), ("FOO", "base"), ("OTHER", "x")]);
        let policy = EnvPolicy {
            inherit: EnvInherit::Core,
            ignore_default_excludes: false,
            exclude: vec![],
            set: map(&[("FOO", "policy")]),
            include_only: vec![],
        };
        let out = child_env(&map(&[("FOO", "overlay")]), Some(&policy), &base);
        assert_eq!(out, map(&[("HOME", "/root"), ("FOO", "overlay")]));
    }

    #[test]
    fn default_excludes_and_include_only() {
        let base = map(&[("API_TOKEN", "s"), ("PATH", "/bin"), ("LANG", "C")]);
        let mut policy = EnvPolicy {
            inherit: EnvInherit::All,
            ignore_default_excludes: false,
            exclude: vec!["lang".into()],
            set: HashMap::new(),
            include_only: vec![],
        };
        assert_eq!(
            child_env(&HashMap::new(), Some(&policy), &base),
            map(&[("PATH", "/bin")])
        );
        policy.ignore_default_excludes = true;
        policy.include_only = vec!["*TOKEN".into()];
        assert_eq!(
            child_env(&HashMap::new(), Some(&policy), &base),
            map(&[("API_TOKEN", "s")])
        );
    }
}
