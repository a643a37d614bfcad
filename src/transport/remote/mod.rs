//! Remote executors' side of the doors (docs/executors.md): [`routes`],
//! the registry's HTTP routes (registration, the rendezvous an executor's
//! link is upgraded from), and [`dial`], this binary as a remote executor
//! dialling out to a registry. (The registry itself, its pools, links and
//! tickets, is `crate::registry`.)

pub mod dial;
pub mod routes;
