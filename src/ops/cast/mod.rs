//! `aclnnCast` on both backends, between the float dtypes: the element-wise conversion
//! `sync_batch_norm` uses to widen a bf16 input to f32 on the device (the statistics operator
//! rejects bf16 on Atlas A2/A3), and a public operator of its own.
//!
//! The public docs are on [`cast`].

pub(in crate::ops) mod cpu;

use ascend_sys::{aclnnStatus, symbols, OpApi};

use super::call::{check_streams, entry_points, run_checked};
use super::launch::Phase2;
use super::operator::{Arg, Handles, Operator, ScalarBits};
use super::prepared::Prepared;
use super::validate;
use crate::device::descriptor::acl_dtype;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::MAX_RANK;
use crate::stream::Stream;
use crate::tensor::Tensor;

/// The dtypes this crate casts between. CANN's aclnnCast takes many more on Atlas A2/A3
/// (docs/cann/SYNCBN.md 3.7), whose integer conversions (NaN to 0, ranges) the crate does not bind.
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const DTYPES_NOTE: &str = "this crate binds aclnnCast between f32, f16 and bf16";

entry_points! {
    /// Converts `input` to `dtype` into a new contiguous tensor of `input`'s shape.
    ///
    /// # Arguments
    /// * `input`: f32, f16 or bf16, 0 to 8 dims, any strides inside its storage (CANN makes it
    ///   contiguous first). An empty input converts nothing and succeeds.
    /// * `dtype`: f32, f16 or bf16 (i32 is rejected: the crate binds the float casts alone).
    ///
    /// # Numerics
    /// A widening cast (bf16 or f16 to f32) is exact on both backends. A narrowing cast rounds
    /// each element once to nearest, ties to even, on the CPU and the mock; CANN's rounding mode
    /// of a narrowing cast is **unconfirmed**. NaN stays NaN, ±inf stays ±inf. Deterministic.
    ///
    /// # Calling
    /// Arguments are validated first, on both backends alike; a rejected call returns
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (161002) and allocates nothing. On
    /// Ascend the work is asynchronous on `stream`: read the result with [`Tensor::to_vec`].
    pub fn cast(
        stream: &Stream,
        input: &Tensor,
        dtype: DType,
    ) -> Result<Tensor> {
        let op = Args { input, dtype };
        op.check_inputs()?;
        check_streams(stream, op.inputs())?;
        let mut output = Tensor::alloc(stream, dtype, input.shape(), false)?;
        run_checked(stream, op, (), [&mut output])?;
        Ok(output)
    }

    /// [`cast`] into the caller-owned `output`: `input`'s shape, dtype `dtype` (CANN takes the
    /// target dtype as an argument and writes it into `out`, so the two must agree), any strides
    /// that do not overlap themselves.
    ///
    /// On Ascend this is `aclnnCastGetWorkspaceSize` followed by `aclnnCast` on `stream`, with the
    /// stream's cached workspace; it returns once the work is enqueued.
    pub fn cast_into(.., output: &mut Tensor) => (Args { input, dtype }, [output]);

    /// Phase 1 of the two-phase API of [`cast_into`]: validates the arguments and, on Ascend,
    /// creates the descriptors and the executor (`aclnnCastGetWorkspaceSize`). The result borrows
    /// every tensor until it is launched ([`Prepared::launch`]) or dropped (which writes nothing).
    pub fn prepare_cast(.., ..) -> Prepared;
}

/// The arguments of a call but its output.
struct Args<'a> {
    input: &'a Tensor,
    dtype: DType,
}

impl Args<'_> {
    /// Validates the input and the target dtype in CANN's order (self's dtype, dtype, rank).
    fn check_inputs(&self) -> Result<()> {
        let input = self.input.layout();
        validate::dtype_in("input", &input, &DTYPES, DTYPES_NOTE)?;
        if !DTYPES.contains(&self.dtype) {
            return Err(Error::invalid(
                "dtype",
                format!("must be f32, f16 or bf16 ({DTYPES_NOTE}), got {}", self.dtype),
            ));
        }
        let rank = input.shape.len();
        if rank > MAX_RANK {
            return Err(Error::invalid(
                "input",
                format!("rank must be at most {}, got {rank} (shape {:?})", MAX_RANK, input.shape),
            ));
        }
        validate::in_storage("input", &input).map(|_| ())
    }
}

/// The target dtype as phase 1's scalar (part of the launch cache's key).
impl ScalarBits for DType {
    fn bits(&self) -> [u64; 4] {
        [*self as u64, 0, 0, 0]
    }
}

impl<'a> Operator<'a> for Args<'a> {
    const OP: &'static symbols::Operator = &symbols::CAST;
    const OUTPUTS: &'static [&'static str] = &["output"];
    type Outputs = [&'a mut Tensor; 1];
    type Plan = ();
    /// The target dtype.
    type Scalars = DType;

    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>> {
        [(Some(self.input), "input")]
    }

    /// The input and dtype, then the output: `input`'s shape (as CANN checks) and dtype `dtype`
    /// (the header's rule, enforced by CANN's copy into `out`), inside its storage.
    fn check(&self, [output]: &Self::Outputs) -> Result<()> {
        self.check_inputs()?;
        let out = output.layout();
        validate::same_shape("output", &out, "input", self.input.shape())?;
        if out.dtype != self.dtype {
            return Err(Error::invalid(
                "output",
                format!("dtype must be the target dtype {}, got {}", self.dtype, out.dtype),
            ));
        }
        validate::in_storage("output", &out).map(|_| ())
    }

    fn scalars(&self) -> DType {
        self.dtype
    }

    fn cpu(self, (): (), [output]: Self::Outputs) -> Result<()> {
        cpu::run(self.input, output)
    }

    unsafe fn phase1(api: &OpApi, dtype: DType, h: Handles<'_>) -> Result<aclnnStatus> {
        let f = crate::acl::op_fn(&api.aclnnCastGetWorkspaceSize, Self::OP.phase1)?;
        // SAFETY: the signature is the header's (wrapper.h, checked against ops-math's
        // aclnn_cast.h); the handles are the call's live descriptors in the prototype's order and
        // the out-pointers are valid (this function's contract).
        Ok(unsafe { f(h.input(0).cast_const(), acl_dtype(dtype), h.output(0), h.size, h.executor) })
    }

    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error> {
        &api.aclnnCast
    }
}
