//! `[tenant_template]`: the settings of every tenant a verified token names
//! that no `[tenants.NAME]` entry configures, when its name matches the
//! template's pattern. Each gets its own root, `ROOTS/{tenant}`, created on
//! first use; an explicit entry replaces the template for its name.

use std::path::PathBuf;

use super::common::ConfigError;
use super::isolation::LayerPolicy;
use super::tenants::{TenantConfig, TenantSettings, check_name, validate_tenant_at};

/// Default `name_pattern`: a DNS label, as Kubernetes names namespaces
/// (lower case, digits and `-`, at most 63 characters, no `-` at either
/// end). Every name it admits is also a safe directory, cgroup and
/// metric-label name.
pub const DEFAULT_NAME_PATTERN: &str = "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?";

/// Longest templated tenant name, whatever the pattern admits.
pub const MAX_TEMPLATED_NAME: usize = 63;

/// The placeholder `root` must end with.
pub const TENANT_PLACEHOLDER: &str = "{tenant}";

/// Validated `[tenant_template]`.
#[derive(Debug, Clone)]
pub struct TemplateSettings {
    /// The pattern as written (anchored when matched).
    pub name_pattern: String,
    matcher: regex_lite::Regex,
    /// The directory every templated root lies in (`root` without its
    /// last component).
    pub roots: PathBuf,
    /// The template's fields, for each tenant's own validation.
    fields: TenantConfig,
    /// The settings of a tenant named `example` (what the descriptor fit
    /// and `/readyz` count per templated tenant).
    pub example: TenantSettings,
    uid_policy: LayerPolicy,
}

impl TemplateSettings {
    /// The settings of templated tenant `name`, or why it has none (a
    /// name outside the pattern).
    pub fn settings_for(&self, name: &str) -> Result<TenantSettings, ConfigError> {
        if !self.admits(name) {
            return Err(ConfigError(format!(
                "tenant `{name}` does not match [tenant_template] name_pattern"
            )));
        }
        let mut fields = self.fields.clone();
        fields.root = Some(self.roots.join(name));
        validate_tenant_at(name, fields, self.uid_policy, false)
    }

    /// Make the roots' directory when missing: mode 0711, passable but not
    /// listable, so host users cannot enumerate the tenants.
    /// One that exists must be a directory (not a link) of the gateway's
    /// user that no one else may write: anyone who could would choose
    /// what a tenant's root is before its first session.
    pub fn make_roots(&self) -> Result<(), ConfigError> {
        use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
        let err = |e: String| {
            ConfigError(format!(
                "tenant_template.root: {}: {e}",
                self.roots.display()
            ))
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&self.roots)
            .map_err(|e| err(format!("cannot make it: {e}")))?;
        let m = std::fs::symlink_metadata(&self.roots).map_err(|e| err(e.to_string()))?;
        let me = nix::unistd::geteuid().as_raw();
        if !m.is_dir() {
            return Err(err("not a directory (a link is refused)".to_owned()));
        }
        if m.uid() != me {
            return Err(err(format!(
                "owned by uid {}: it must be the gateway's (uid {me}), or another user could plant a tenant's root",
                m.uid()
            )));
        }
        if m.mode() & 0o022 != 0 {
            // Ours, but writable by others (a fresh volume is often 0777):
            // closed now; a root someone planted meanwhile is refused at
            // its tenant's activation (not the tenant's uid).
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(
                &self.roots,
                std::fs::Permissions::from_mode(m.mode() & 0o7755 & !0o022),
            )
            .map_err(|e| err(format!("cannot close it to others (chmod go-w): {e}")))?;
        }
        Ok(())
    }

    /// Whether `name` may be a templated tenant: the pattern matches it
    /// whole, and it is a plain directory name of at most
    /// [`MAX_TEMPLATED_NAME`] bytes.
    pub fn admits(&self, name: &str) -> bool {
        name.len() <= MAX_TEMPLATED_NAME && check_name(name).is_ok() && self.matcher.is_match(name)
    }
}

/// Validate `[tenant_template]` (a table of `[tenants.NAME]` fields plus
/// `name_pattern`, with `root` ending in `/{tenant}`).
pub(super) fn validate_template(
    mut table: toml::Table,
    uid_policy: LayerPolicy,
) -> Result<TemplateSettings, ConfigError> {
    let name_pattern = match table.remove("name_pattern") {
        None => DEFAULT_NAME_PATTERN.to_owned(),
        Some(toml::Value::String(p)) => p,
        Some(_) => {
            return Err(ConfigError(
                "tenant_template.name_pattern must be a string (a regular expression)".to_owned(),
            ));
        }
    };
    let matcher = regex_lite::RegexBuilder::new(&format!("^(?:{name_pattern})$"))
        .size_limit(1 << 20)
        .build()
        .map_err(|e| ConfigError(format!("tenant_template.name_pattern: {e}")))?;
    let fields: TenantConfig =
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                ConfigError(format!(
                    "tenant_template: {}",
                    e.to_string().replace('\n', " ").trim()
                ))
            })?;
    let root = fields.root.clone().ok_or_else(|| {
        ConfigError(format!(
            "tenant_template.root is required, e.g. \"/srv/exec-gateway/tenants/{TENANT_PLACEHOLDER}\""
        ))
    })?;
    let text = root.to_string_lossy();
    let roots = match text.strip_suffix(&format!("/{TENANT_PLACEHOLDER}")) {
        Some(r) if !r.contains('{') && !r.contains('}') && !r.is_empty() => PathBuf::from(r),
        _ => {
            return Err(ConfigError(format!(
                "tenant_template.root = {text:?}: it must be an absolute directory ending in /{TENANT_PLACEHOLDER}, which names no other placeholder"
            )));
        }
    };
    if !roots.is_absolute()
        || roots.components().any(|c| {
            !matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::RootDir
            )
        })
    {
        return Err(ConfigError(format!(
            "tenant_template.root: {} must be absolute, without `.` or `..`",
            roots.display()
        )));
    }
    if fields.uid.is_some() || fields.gid.is_some() {
        return Err(ConfigError(
            "tenant_template: uid and gid are allocated per tenant from [isolation] uid_range; a template cannot name one (every tenant would share it)".to_owned(),
        ));
    }
    if fields.pool.is_some() || !fields.pool_labels.is_empty() || fields.placement.is_some() {
        return Err(ConfigError(
            "tenant_template: pool, pool_labels and placement cannot be templated: a pool serves one tenant, and every templated tenant would share its executors (configure a tenant that needs executors as [tenants.NAME] with its own pool)".to_owned(),
        ));
    }
    let mut example_fields = fields.clone();
    example_fields.root = Some(roots.join("example"));
    let example = validate_tenant_at("example", example_fields, uid_policy, false)
        .map_err(|e| ConfigError(e.0.replacen("tenants.example", "tenant_template", 1)))?;
    Ok(TemplateSettings {
        name_pattern,
        matcher,
        roots,
        fields,
        example,
        uid_policy,
    })
}

/// The template's roots must be apart from every configured tenant's root
/// (one exception: `ROOTS/NAME` for tenant `NAME` itself, which the
/// template would have given it), from the state directory and from
/// every secret file.
pub(super) fn refuse_template_overlaps<'a>(
    t: &TemplateSettings,
    tenants: impl Iterator<Item = (&'a String, &'a TenantSettings)>,
    secret_files: &[PathBuf],
) -> Result<(), ConfigError> {
    let roots = t.roots.canonicalize().unwrap_or_else(|_| t.roots.clone());
    for (name, s) in tenants {
        let Some(r) = &s.root else {
            return Err(ConfigError(format!(
                "tenants.{name}.root is `/`, which holds the template's roots {}",
                roots.display()
            )));
        };
        let r = r.canonicalize().unwrap_or_else(|_| r.clone());
        if r == roots.join(name) {
            continue;
        }
        if r.starts_with(&roots) || roots.starts_with(&r) {
            return Err(ConfigError(format!(
                "tenants.{name}.root {} and tenant_template.root {}/{TENANT_PLACEHOLDER} overlap; tenant roots must be disjoint",
                r.display(),
                roots.display()
            )));
        }
    }
    if let Ok(state) = super::common::state_dir() {
        let state = state.canonicalize().unwrap_or(state);
        if state.starts_with(&roots) || roots.starts_with(&state) {
            return Err(ConfigError(format!(
                "tenant_template.root {} and the gateway's state directory {} overlap; choose another root or set XDG_STATE_HOME",
                roots.display(),
                state.display()
            )));
        }
    }
    if let Some(f) = secret_files.iter().find(|f| f.starts_with(&roots)) {
        return Err(ConfigError(format!(
            "tenant_template: secret file {} lies inside {}, where tenants' roots are",
            f.display(),
            roots.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn template(extra: &str) -> Result<TemplateSettings, ConfigError> {
        let t: toml::Table =
            toml::from_str(&format!("root = \"/srv/t/{{tenant}}\"\n{extra}")).unwrap();
        validate_template(t, LayerPolicy::Optional)
    }

    #[test]
    fn names_are_plain_directory_names_never_options_or_cgroup_files() {
        let t = template("").unwrap();
        for ok in ["team-a", "a", "x1", &"a".repeat(63)] {
            assert!(t.admits(ok), "{ok}");
            assert_eq!(
                t.settings_for(ok).unwrap().root.unwrap(),
                Path::new("/srv/t").join(ok)
            );
        }
        for bad in [
            "",
            "Team",
            "-a",
            "a-",
            "a_b",
            &"a".repeat(64),
            "a/b",
            "..",
            ".uids",
        ] {
            assert!(!t.admits(bad), "{bad}");
        }
        // Whatever a pattern allows, these stay out.
        let any = template("name_pattern = \".*\"").unwrap();
        for bad in [
            "-h",
            "--help",
            ".x",
            "tasks",
            "cgroup.procs",
            "memory.max",
            "a/b",
            "a b",
        ] {
            assert!(!any.admits(bad), "{bad}");
        }
        assert!(any.admits("A_b.c"));
    }

    #[test]
    fn a_bad_template_is_refused() {
        for (extra, want) in [
            ("name_pattern = \"(\"", "name_pattern"),
            ("uid = 5000", "uid"),
            ("pool = \"p\"", "a pool serves one tenant"),
            ("placement = \"local\"", "cannot be templated"),
            ("pool_labels = { kind = \"x\" }", "cannot be templated"),
            ("max_tmp_bytes = 1", "tenant_template.max_tmp_bytes"),
        ] {
            let e = template(extra).unwrap_err().0;
            assert!(e.contains(want), "{extra}: {e}");
        }
        for root in [
            "/srv/{tenant}/x",
            "srv/{tenant}",
            "/srv/../{tenant}",
            "/{tenant}",
            "/srv/t",
        ] {
            let t: toml::Table = toml::from_str(&format!("root = \"{root}\"")).unwrap();
            assert!(
                validate_template(t, LayerPolicy::Optional).is_err(),
                "{root}"
            );
        }
    }
}
