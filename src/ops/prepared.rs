//! [`Prepared`]: the two-phase API's validated call, shared by every operator.

use super::launch::{DevicePrepared, Workspace};
use crate::error::Result;
use crate::stream::Stream;

/// A validated call, ready to launch (phase 2), made by an operator's `prepare_*` function.
///
/// It borrows every tensor of the call until it is launched or dropped, so none can be freed,
/// refilled or read in between. On Ascend, phase 1 has run (`aclnn*GetWorkspaceSize`: the
/// descriptors and the executor exist); [`launch`](Self::launch) runs phase 2, which consumes the
/// executor, so a prepared call runs once. Dropping it unlaunched destroys the executor
/// (`aclSetAclOpExecutorRepeatable` + `aclDestroyAclOpExecutor`) and writes nothing. Phase 1 runs
/// for every prepared call, as in CANN's own API: the stream's launch cache serves the `_into`
/// and allocating entries, whose launch stays on the stream they were given.
#[must_use = "a prepared call does nothing until it is launched"]
pub struct Prepared<'a> {
    kind: Kind<'a>,
}

enum Kind<'a> {
    /// The CPU kernel, with its validated arguments.
    Cpu(Box<dyn FnOnce() -> Result<()> + 'a>),
    Ascend(Box<DevicePrepared<'a>>),
}

impl std::fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Cpu(_) => f.write_str("Prepared(Cpu)"),
            Kind::Ascend(a) => f.debug_tuple("Prepared").field(a).finish(),
        }
    }
}

impl<'a> Prepared<'a> {
    /// A call for the CPU backend: `run` is the kernel over the validated arguments.
    pub(crate) fn cpu(run: impl FnOnce() -> Result<()> + 'a) -> Self {
        Prepared { kind: Kind::Cpu(Box::new(run)) }
    }

    /// A call for Ascend, phase 1 done.
    pub(crate) fn ascend(prepared: DevicePrepared<'a>) -> Self {
        Prepared { kind: Kind::Ascend(Box::new(prepared)) }
    }

    /// The workspace phase 2 needs, in bytes (0 on the CPU, and often on Ascend).
    pub fn workspace_size(&self) -> u64 {
        match &self.kind {
            Kind::Cpu(_) => 0,
            Kind::Ascend(a) => a.workspace_size(),
        }
    }

    /// Phase 2: enqueues the work on `stream`, which must be on the device the tensors live on
    /// (the CPU backend runs it now). With `workspace = None` the stream's cached workspace is
    /// used; a caller-owned [`Workspace`] must hold at least
    /// [`workspace_size`](Self::workspace_size) bytes (null is passed when that is 0).
    pub fn launch(self, stream: &Stream, workspace: Option<&Workspace>) -> Result<()> {
        match self.kind {
            Kind::Cpu(run) => {
                if stream.ascend().is_some() {
                    return Err(stream.mismatch("stream", "the call was prepared on the CPU backend"));
                }
                run()
            }
            Kind::Ascend(a) => a.launch(stream, workspace),
        }
    }
}
