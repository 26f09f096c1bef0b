//! The one instruction-set choice of every CPU kernel: detected once per process, with the
//! environment variable `ASCEND_CPU_ISA` able to ask for a lesser set (benchmarks, A/B tests).
//!
//! Every kernel's instruction-set builds give the same bits, so the choice only changes speed.
//! The rules:
//! - The best set this CPU supports is chosen: on x86-64 `Avx512` (AVX-512 F, BW and VL on top of
//!   AVX2), else `Avx2` (AVX2, FMA and F16C), else [`Isa::Portable`]; on aarch64 `Neon`.
//! - `ASCEND_CPU_ISA` (read once, ASCII case and surrounding blanks ignored) names a set by
//!   [`Isa::name`]: `portable`, `avx2`, `avx512` or `neon`. A set this CPU supports is used; a set it lacks,
//!   or any other value, is reported once on standard error (`ascend: ...`) and the best set is
//!   used. An empty variable counts as unset. Nothing here ever panics.

use std::sync::OnceLock;

/// The environment variable that asks for a lesser instruction set.
pub(crate) const ISA_ENV: &str = "ASCEND_CPU_ISA";

/// The instruction set the CPU kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Plain Rust (any target).
    Portable,
    /// AVX2 + FMA + F16C (x86-64, detected at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 F + BW + VL on top of [`Isa::Avx2`] (x86-64, detected at run time).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// Advanced SIMD (NEON), part of every aarch64 CPU the target supports.
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// Every instruction set of this build, least first.
    const ALL: &'static [Isa] = &[
        Isa::Portable,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon,
    ];

    /// The instruction set of every kernel call: the best this CPU supports unless
    /// `ASCEND_CPU_ISA` names a lesser one (see the [module](self) docs). Decided once.
    pub(crate) fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let value = std::env::var_os(ISA_ENV);
            let (isa, warning) = Isa::choose(Isa::best(), value.as_deref());
            if let Some(w) = warning {
                crate::device::report(format_args!("{w}"));
            }
            isa
        })
    }

    /// The choice for the variable's `value` on a CPU whose best set is `best`, and the warning
    /// to give when the value is not honoured.
    fn choose(best: Isa, value: Option<&std::ffi::OsStr>) -> (Isa, Option<String>) {
        let Some(value) = value else { return (best, None) };
        let Some(text) = value.to_str() else {
            return (best, Some(format!("{ISA_ENV} is not valid Unicode; using {}", best.name())));
        };
        let name = text.trim().to_ascii_lowercase();
        if name.is_empty() {
            return (best, None);
        }
        let known = || Isa::ALL.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ");
        match Isa::ALL.iter().copied().find(|i| i.name() == name) {
            Some(isa) if isa.rank() <= best.rank() => (isa, None),
            Some(isa) => (
                best,
                Some(format!("{ISA_ENV}={text}: this CPU does not support {}; using {}", isa.name(), best.name())),
            ),
            None => (best, Some(format!("{ISA_ENV}={text} is not one of {}; using {}", known(), best.name()))),
        }
    }

    /// Position in [`Isa::ALL`] (each set includes the ones before it).
    fn rank(self) -> usize {
        Isa::ALL.iter().position(|&i| i == self).unwrap_or(0)
    }

    /// The best instruction set this CPU supports.
    fn best() -> Isa {
        Isa::supported().last().copied().unwrap_or(Isa::Portable)
    }

    /// Every instruction set this CPU supports, least first (the tests compare them all).
    pub(crate) fn supported() -> Vec<Isa> {
        Isa::ALL.iter().copied().filter(|i| i.available()).collect()
    }

    /// Whether this CPU runs the instruction set's code.
    fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                use std::arch::is_x86_feature_detected as has;
                has!("avx2") && has!("fma") && has!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                use std::arch::is_x86_feature_detected as has;
                Isa::Avx2.available() && has!("avx512f") && has!("avx512bw") && has!("avx512vl")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
        }
    }

    /// The instruction set's name, as `ASCEND_CPU_ISA` spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn unset_or_empty_gives_the_best() {
        for best in Isa::ALL.iter().copied() {
            assert_eq!(Isa::choose(best, None), (best, None));
            assert_eq!(Isa::choose(best, Some(OsStr::new(""))), (best, None));
            assert_eq!(Isa::choose(best, Some(OsStr::new("  "))), (best, None));
        }
    }

    #[test]
    fn a_lesser_or_equal_set_is_honoured_in_any_case() {
        let best = *Isa::ALL.last().unwrap();
        for isa in Isa::ALL.iter().copied() {
            assert_eq!(Isa::choose(best, Some(OsStr::new(isa.name()))), (isa, None));
            let loud = format!(" {} ", isa.name().to_ascii_uppercase());
            assert_eq!(Isa::choose(best, Some(OsStr::new(&loud))), (isa, None));
        }
        assert_eq!(Isa::choose(Isa::Portable, Some(OsStr::new("portable"))), (Isa::Portable, None));
    }

    #[test]
    fn odd_values_warn_and_give_the_best() {
        let best = *Isa::ALL.last().unwrap();
        for v in ["sse9", "avx-2", "1", "portable,avx2"] {
            let (isa, w) = Isa::choose(best, Some(OsStr::new(v)));
            assert_eq!(isa, best, "{v}");
            let w = w.unwrap_or_default();
            assert!(w.contains(ISA_ENV) && w.contains(v) && w.contains("portable"), "{v}: {w}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let (isa, w) = Isa::choose(best, Some(OsStr::from_bytes(&[0xff, 0xfe])));
            assert_eq!(isa, best);
            assert!(w.is_some_and(|w| w.contains("Unicode")));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_set_the_cpu_lacks_is_never_chosen() {
        let (isa, w) = Isa::choose(Isa::Avx2, Some(OsStr::new("avx512")));
        assert_eq!(isa, Isa::Avx2);
        assert!(w.is_some_and(|w| w.contains("does not support avx512")));
        let (isa, w) = Isa::choose(Isa::Portable, Some(OsStr::new("avx2")));
        assert_eq!(isa, Isa::Portable);
        assert!(w.is_some());
    }

    #[test]
    fn the_chosen_set_is_supported() {
        let s = Isa::supported();
        assert_eq!(s.first(), Some(&Isa::Portable));
        assert!(s.contains(&Isa::detect()));
        assert_eq!(Isa::best(), *s.last().unwrap());
        // Every aarch64 CPU the target supports has NEON, so its code is always compared.
        #[cfg(target_arch = "aarch64")]
        assert_eq!(s, [Isa::Portable, Isa::Neon]);
    }
}
