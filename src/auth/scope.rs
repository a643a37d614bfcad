//! Scopes: the permissions a token grants, and the set a caller holds.

/// A permission a token grants (docs/protocol.md, "Scopes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `exec`: process/* and command/exec*.
    Exec,
    /// `fs:read`: readFile, getMetadata, readDirectory.
    FsRead,
    /// `fs:write`: writeFile, createDirectory, remove, copy.
    FsWrite,
    /// `snapshot`: the `gateway/snapshot/*` methods, and a session that
    /// starts as a snapshot's copy.
    Snapshot,
    /// `forward`: a TCP stream to a port on a session's own loopback
    /// (docs/forward.md).
    Forward,
    /// `preview`: HTTP into a session's port through a preview, and the
    /// `gateway/preview/*` methods that mint and revoke preview URLs
    /// (docs/preview.md).
    Preview,
    /// `egress`: read and change the tenant's egress names
    /// (`gateway/egress/*`; docs/isolation.md, "Egress by name").
    Egress,
}

impl Scope {
    /// Every scope, in the order tokens list them.
    pub const ALL: [Scope; 7] = [
        Scope::Exec,
        Scope::FsRead,
        Scope::FsWrite,
        Scope::Snapshot,
        Scope::Forward,
        Scope::Preview,
        Scope::Egress,
    ];

    /// The scope's name in tokens and error data.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Exec => "exec",
            Scope::FsRead => "fs:read",
            Scope::FsWrite => "fs:write",
            Scope::Snapshot => "snapshot",
            Scope::Forward => "forward",
            Scope::Preview => "preview",
            Scope::Egress => "egress",
        }
    }

    pub fn parse(name: &str) -> Option<Scope> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The set of scopes a caller holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    pub const ALL: Scopes = Scopes(0b111_1111);
    /// What a token without a scope claim gets from a key bound to its
    /// tenant (and `exec-gateway token` without `--scope`): every scope
    /// but `egress`, which changes what the tenant's network may reach and
    /// is granted only by name.
    pub const DEFAULT: Scopes = Scopes(0b011_1111);

    pub fn grants(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Add a scope by name; unknown names are ignored (tokens may carry
    /// scopes meant for other services).
    pub(super) fn add(&mut self, name: &str) {
        if let Some(s) = Scope::parse(name) {
            self.0 |= s.bit();
        }
    }

    /// Exactly these scopes.
    pub fn of(scopes: &[Scope]) -> Scopes {
        Scopes(scopes.iter().fold(0, |bits, s| bits | s.bit()))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}
