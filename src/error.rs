//! [`Error`] and [`Result`]: every failure of the crate, with CANN's status code where it has one.

use ascend_sys::status;

/// The status CANN returns for a null required argument (`ACLNN_ERR_PARAM_NULLPTR`).
pub const STATUS_NULLPTR: i32 = status::ACLNN_ERR_PARAM_NULLPTR;
/// The status CANN returns for an invalid argument (`ACLNN_ERR_PARAM_INVALID`).
pub const STATUS_INVALID: i32 = status::ACLNN_ERR_PARAM_INVALID;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong. Match on the variant, or use [`Error::status`] for CANN's code.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before any work was enqueued; nothing was written.
    /// `status` is the aclnn code CANN uses for the case: 161001 (a required argument is
    /// missing) or 161002 (an argument is invalid).
    #[error("invalid argument `{argument}`: {message} (aclnn status {status} {})", status_name(*status))]
    InvalidArgument {
        /// The parameter, named as in the aclnn API (`gradOut`, `input`, `mean`, `sumDy`, ...).
        argument: &'static str,
        /// What was expected and what was given.
        message: String,
        /// 161001 or 161002.
        status: i32,
    },
    /// A CANN call returned a non-zero status.
    #[error("{call} failed with status {status} ({}){}", status_name(*status), recent(.message))]
    Cann {
        /// The C function that failed.
        call: &'static str,
        /// The status it returned.
        status: i32,
        /// The text of `aclGetRecentErrMsg`, when CANN gave one.
        message: Option<String>,
    },
    /// A CANN call that returns a pointer returned null.
    #[error("{call} returned null{}", recent(.message))]
    NullHandle {
        /// The C function that failed.
        call: &'static str,
        /// The text of `aclGetRecentErrMsg`, when CANN gave one.
        message: Option<String>,
    },
    /// A collective (or making a communicator) failed: HCCL's `HcclResult`, by name. The CPU
    /// engine reports the same results (e.g. `HCCL_E_TIMEOUT` for a rank that never arrived).
    #[error("{call} failed with {name} ({result}){}", recent(.message))]
    Hccl {
        /// The HCCL function.
        call: &'static str,
        /// The `HcclResult` value.
        result: u32,
        /// Its name (e.g. `HCCL_E_TIMEOUT`).
        name: &'static str,
        /// `HcclGetErrorString`'s text, or the CPU engine's explanation.
        message: Option<String>,
    },
    /// The CANN libraries, one operator, HCCL or one of its optional functions could not be
    /// loaded: the [`LoadError`](ascend_sys::LoadError) variant says which, and what was tried.
    #[error("loading CANN: {0}")]
    Load(#[from] ascend_sys::LoadError),
    /// CANN loaded but the requested device does not exist.
    #[error("Ascend device {device} not found: {count} device(s) present")]
    NoDevice {
        /// The device asked for.
        device: i32,
        /// How many devices CANN reports.
        count: u32,
    },
    /// A host allocation failed (the CPU backend, or a staging copy).
    #[error("could not allocate {bytes} bytes of host memory")]
    HostAlloc {
        /// The size asked for.
        bytes: usize,
    },
    /// The launcher rendezvous of [`Communicator::from_env`](crate::hccl::Communicator::from_env)
    /// failed: the message names the peer (rank 0's address, or the ranks that never came).
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    /// Configuration was invalid (e.g. an unknown `ASCEND_BACKEND` value).
    #[error("configuration: {0}")]
    Config(String),
    /// A state the crate's types do not yet rule out was reached (say a device tensor in a CPU
    /// kernel after the stream checks passed): a bug in this crate, not in the call. Please report
    /// it with the message.
    #[error("internal error (a bug in this crate): {what}")]
    Internal {
        /// Which state was reached, and where.
        what: String,
    },
}

fn status_name(status: i32) -> &'static str {
    status::name(status).unwrap_or("unknown status")
}

fn recent(message: &Option<String>) -> String {
    match message {
        Some(m) if !m.is_empty() => format!(": {m}"),
        _ => String::new(),
    }
}

impl Error {
    /// The CANN status code: 161001/161002 for argument errors (on both backends), the
    /// returned code for a failed CANN call, `None` otherwise.
    pub fn status(&self) -> Option<i32> {
        match self {
            Error::InvalidArgument { status, .. } | Error::Cann { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The `HcclResult` of a failed collective ([`Error::Hccl`]).
    pub fn hccl_result(&self) -> Option<u32> {
        match self {
            Error::Hccl { result, .. } => Some(*result),
            _ => None,
        }
    }

    /// The name of [`status`](Self::status), e.g. `ACLNN_ERR_PARAM_INVALID`.
    pub fn status_name(&self) -> Option<&'static str> {
        self.status().and_then(status::name)
    }

    /// A failed HCCL call (or the CPU engine's equivalent) with `HcclResult` `result`, named
    /// from [`ascend_sys::status::hccl_name`]; an empty `message` is none.
    pub(crate) fn hccl(call: &'static str, result: u32, message: impl Into<String>) -> Self {
        let message = message.into();
        let name = status::hccl_name(result).unwrap_or("unknown HcclResult");
        Error::Hccl { call, result, name, message: (!message.is_empty()).then_some(message) }
    }

    pub(crate) fn invalid(argument: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument { argument, message: message.into(), status: STATUS_INVALID }
    }

    pub(crate) fn internal(what: impl Into<String>) -> Self {
        Error::Internal { what: what.into() }
    }

    pub(crate) fn null(argument: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument { argument, message: message.into(), status: STATUS_NULLPTR }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An internal state is neither an argument error nor a CANN failure: it carries no status
    /// and says it is the crate's bug, with what was reached.
    #[test]
    fn internal_errors_say_they_are_the_crates_bug() {
        let e = Error::internal("input: a device tensor reached the CPU backend");
        assert_eq!(e.status(), None);
        assert_eq!(e.status_name(), None);
        assert!(!matches!(e, Error::InvalidArgument { .. } | Error::Config(_)), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("a bug in this crate"), "{text}");
        assert!(text.contains("input: a device tensor reached the CPU backend"), "{text}");
    }
}
