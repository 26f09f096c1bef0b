//! The CPU kernel of [`cast`](super::cast): every element widened to f32 (exact for f32, f16 and
//! bf16) and rounded once into the output's dtype (to nearest, ties to even), over any strides
//! through [`channelwise::map`] (merged runs, several threads for large dense outputs).

use crate::cpu::channelwise::{self, Channels, Dst, Src};
use crate::cpu::host;
use crate::error::Result;
use crate::tensor::Tensor;

/// Runs the validated call (an empty input writes nothing).
pub(super) fn run(input: &Tensor, output: &mut Tensor) -> Result<()> {
    let (shape, out_strides, out_offset) = (output.shape().to_vec(), output.strides().to_vec(), output.offset());
    let x = host::view(input, "input")?;
    let y = host::view_mut(output, "output")?;
    let src = Src::new(x.storage(), input.shape(), input.strides(), input.offset());
    let dst = Dst::new(y.into_storage(), &shape, &out_strides, out_offset);
    let copy = |[x]: &[&[f32]; 1], out: &mut [f32], _: Channels| out.copy_from_slice(x);
    channelwise::map([src], dst, 0, &copy)
}
