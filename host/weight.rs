//! Quantized weights on the host, in the flat (interchange) and the runtime
//! (tiled) layout.

use crate::{Codebook, Error, Result};
use kbit_format::tile;

/// The shape of a weight `W[N, K]`: N out features (rows), K in features
/// (columns, a multiple of 32).
///
/// ```
/// let s = kbit::Shape::new(4096, 2048)?;
/// assert_eq!(s.num_blocks(), 4096 * 2048 / 32);
/// assert!(kbit::Shape::new(16, 100).is_err());
/// # Ok::<(), kbit::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Out features (rows of W).
    pub n: usize,
    /// In features (columns of W), a multiple of 32.
    pub k: usize,
}

impl Shape {
    /// Validates N ≥ 1, K a positive multiple of 32, and fewer than 2^32 − 1
    /// quant blocks, counting the zero half tile of the runtime layout when
    /// `K % 64 == 32` (the kernels index blocks and their storage slots with
    /// u32).
    pub fn new(n: usize, k: usize) -> Result<Self> {
        if n == 0 {
            return Err(Error::OutFeatures);
        }
        if k == 0 || k % 32 != 0 {
            return Err(Error::InFeatures(k));
        }
        let blocks = n.checked_mul(k.div_ceil(64) * 2).ok_or(Error::TooLarge { n, k })?;
        if blocks >= u32::MAX as usize || n > u32::MAX as usize || k > u32::MAX as usize {
            return Err(Error::TooLarge { n, k });
        }
        Ok(Self { n, k })
    }

    /// Elements `N·K`.
    pub fn numel(&self) -> usize {
        self.n * self.k
    }

    /// Quant blocks `N·K/32`.
    pub fn num_blocks(&self) -> usize {
        self.numel() / kbit_format::BLOCK
    }

    /// Plane words of the flat layout, including the k padding words.
    pub fn flat_words(&self, bits: u32) -> usize {
        (self.num_blocks() + 1) * bits as usize
    }

    /// Absmax entries of the flat layout, including the padding entry.
    pub fn flat_absmax(&self) -> usize {
        self.num_blocks() + 1
    }

    /// Plane words of the runtime layout.
    pub fn tiled_words(&self, bits: u32) -> usize {
        tile::words(self.n, self.k, bits as usize)
    }

    /// Scale bytes of the runtime layout.
    pub fn tiled_scales(&self) -> usize {
        tile::scales(self.n, self.k)
    }

    /// Bytes a kernel streams to read the whole weight in the runtime layout.
    pub fn tiled_bytes(&self, bits: u32) -> usize {
        self.tiled_words(bits) * 4 + self.tiled_scales()
    }
}

/// What repack does with a block absmax above 31 (the E4M4 maximum).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScaleMode {
    /// Report [`Error::ScaleRange`] naming the first such block.
    #[default]
    Strict,
    /// Clamp to 31.0 (values past it lose accuracy).
    Saturate,
}

pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got { Ok(()) } else { Err(Error::Length { what, expected, got }) }
}

/// A quantized weight in the flat interchange layout (FORMAT.md): for block
/// `b`, plane `j` is `packed[b·k + j]`, its scale `absmax[b]` (f32); k zero
/// padding words and one zero padding absmax follow.
#[derive(Clone, Debug, PartialEq)]
pub struct FlatWeight {
    shape: Shape,
    codebook: Codebook,
    packed: Vec<u32>,
    absmax: Vec<f32>,
}

impl FlatWeight {
    /// Assembles a flat weight from its parts (e.g. read from a file),
    /// checking the lengths (padding included).
    pub fn from_parts(shape: Shape, codebook: Codebook, packed: Vec<u32>, absmax: Vec<f32>) -> Result<Self> {
        check_len("packed words", shape.flat_words(codebook.bits()), packed.len())?;
        check_len("absmax entries", shape.flat_absmax(), absmax.len())?;
        Ok(Self { shape, codebook, packed, absmax })
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// The codebook (and so the bit width).
    pub fn codebook(&self) -> &Codebook {
        &self.codebook
    }
    /// Plane words, padding included.
    pub fn packed(&self) -> &[u32] {
        &self.packed
    }
    /// Block absmax values, padding included.
    pub fn absmax(&self) -> &[f32] {
        &self.absmax
    }
}

/// A quantized weight in the runtime (tiled) layout with E4M4 scales
/// (`kbit_format::tile`), as it lives on the device.
#[derive(Clone, Debug, PartialEq)]
pub struct TiledWeight {
    shape: Shape,
    codebook: Codebook,
    packed: Vec<u32>,
    scales: Vec<u8>,
}

impl TiledWeight {
    /// Assembles a tiled weight from its parts, checking the lengths.
    pub fn from_parts(shape: Shape, codebook: Codebook, packed: Vec<u32>, scales: Vec<u8>) -> Result<Self> {
        check_len("tiled words", shape.tiled_words(codebook.bits()), packed.len())?;
        check_len("tiled scales", shape.tiled_scales(), scales.len())?;
        Ok(Self { shape, codebook, packed, scales })
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// The codebook (and so the bit width).
    pub fn codebook(&self) -> &Codebook {
        &self.codebook
    }
    /// Plane words in tile order.
    pub fn packed(&self) -> &[u32] {
        &self.packed
    }
    /// E4M4 scale bytes in tile order.
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }
}
