//! Codebooks: the 2^k values that k-bit indices select.

use crate::{Error, Result};

/// A codebook of `2^k` f32 values, k in 2..=5, carried with every weight.
///
/// ```
/// let cb = kbit::Codebook::nf(4)?;
/// assert_eq!(cb.bits(), 4);
/// assert_eq!(cb.values().len(), 16);
/// assert_eq!(cb.values()[15], 1.0);
/// let custom = kbit::Codebook::new(vec![-1.0, -0.25, 0.25, 1.0])?;
/// assert_eq!(custom.bits(), 2);
/// # Ok::<(), kbit::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Codebook {
    bits: u32,
    values: Vec<f32>,
}

/// Checks that `bits` is a supported bit width.
pub(crate) fn check_bits(bits: u32) -> Result<()> {
    if (kbit_format::MIN_BITS..=kbit_format::MAX_BITS).contains(&bits) { Ok(()) } else { Err(Error::Bits(bits)) }
}

impl Codebook {
    /// The "normal float" NF-k codebook (FORMAT.md): ascending, symmetric,
    /// endpoints ±1.
    ///
    /// ```
    /// let cb = kbit::Codebook::nf(3)?;
    /// assert_eq!(cb.values().len(), 8);
    /// assert_eq!((cb.values()[0], cb.values()[7]), (-1.0, 1.0));
    /// assert!(matches!(kbit::Codebook::nf(6), Err(kbit::Error::Bits(6))));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn nf(bits: u32) -> Result<Self> {
        check_bits(bits)?;
        Ok(Self { bits, values: kbit_format::nf::codebook(bits) })
    }

    /// A custom codebook; its length (4, 8, 16 or 32) sets k. Entries must be
    /// finite; their order is free (the nearest entry wins, ties to the lowest
    /// index).
    ///
    /// ```
    /// let cb = kbit::Codebook::new(vec![0.5, -0.5, 1.0, -1.0, 0.0, 0.25, -0.25, 0.75])?;
    /// assert_eq!(cb.bits(), 3);
    /// assert!(matches!(kbit::Codebook::new(vec![0.0; 5]), Err(kbit::Error::CodebookLen(5))));
    /// assert!(kbit::Codebook::new(vec![-1.0, f32::NAN, 0.5, 1.0]).is_err());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn new(values: Vec<f32>) -> Result<Self> {
        let bits = match values.len() {
            4 => 2,
            8 => 3,
            16 => 4,
            32 => 5,
            n => return Err(Error::CodebookLen(n)),
        };
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::CodebookValue { index, value });
        }
        Ok(Self { bits, values })
    }

    /// The bit width k.
    ///
    /// ```
    /// assert_eq!(kbit::Codebook::nf(5)?.bits(), 5);
    /// assert_eq!(kbit::Codebook::new(vec![-1.0, -0.25, 0.25, 1.0])?.bits(), 2);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// The entries, indexed by code.
    ///
    /// ```
    /// let cb = kbit::Codebook::new(vec![1.0, -1.0, 0.25, -0.25])?;
    /// assert_eq!(cb.values(), &[1.0, -1.0, 0.25, -0.25]); // kept in the given order
    /// let nf = kbit::Codebook::nf(4)?;
    /// assert!(nf.values().windows(2).all(|p| p[0] < p[1])); // NF-k is ascending
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// The largest gap between adjacent entries in sorted order (the
    /// quantization error bound is half of it, times the block absmax).
    ///
    /// ```
    /// let cb = kbit::Codebook::new(vec![1.0, -1.0, 0.5, 0.0])?;
    /// assert_eq!(cb.max_gap(), 1.0); // sorted: -1, 0, 0.5, 1
    /// assert!(kbit::Codebook::nf(5)?.max_gap() < kbit::Codebook::nf(2)?.max_gap());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn max_gap(&self) -> f32 {
        let mut v = self.values.clone();
        v.sort_by(f32::total_cmp);
        v.windows(2).map(|w| w[1] - w[0]).fold(0.0, f32::max)
    }
}
