//! # anygpu
//!
//! TensorFlow's `tf.config` device control — list the GPUs, hide some, let memory grow instead
//! of reserving it all, cut one GPU into several capped logical GPUs, see and steer where each op
//! runs, fall back to the CPU — on any GPU wgpu reaches (Vulkan, Metal, DX12, GL, and software
//! adapters such as Mesa's lavapipe and llvmpipe), with compute shaders written in WGSL. On top,
//! a Keras-like `Sequential` trains convolutional networks layer by layer on the devices you pick.
//!
//! ## Devices and placement
//!
//! ```
//! use anygpu::{Runtime, Tensor};
//!
//! // An explicit runtime: no global state (the `config` module is the process-wide one).
//! let rt = Runtime::builder().memory_growth(true).build()?;
//! for device in rt.list_logical_devices("GPU")? {
//!     println!("{} on {}", device.name(), device.adapter_name());
//! }
//!
//! // `with tf.device("/device:GPU:0")`: soft placement runs it on the CPU if there is no GPU.
//! let product = rt.device_scope("/device:GPU:0", || {
//!     let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//!     let b = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
//!     a.matmul(&b)
//! })??;
//! assert_eq!(product.to_vec::<f32>()?, [22.0, 28.0, 49.0, 64.0]);
//! # Ok::<(), anygpu::Error>(())
//! ```
//!
//! ## Memory
//!
//! ```
//! use anygpu::Runtime;
//! // Two virtual GPUs of 64 MiB cut from the first GPU, if there is one.
//! let builder = Runtime::builder();
//! let has_gpu = !Runtime::new().list_physical_devices("GPU").is_empty();
//! let rt = if has_gpu { builder.virtual_gpus(0, &[64, 64]) } else { builder }.build()?;
//! if has_gpu {
//!     let info = rt.get_memory_info("GPU:1")?;
//!     assert_eq!(info.current, 0);
//! }
//! # Ok::<(), anygpu::Error>(())
//! ```
//!
//! ## Environment variables
//!
//! | variable | effect |
//! |---|---|
//! | `WGPU_BACKEND` | backends searched for adapters (`vulkan,gl`, `metal`, `dx12`, ...), as in wgpu |
//! | `ANYGPU_VISIBLE_DEVICES` | `2,0`: only these physical GPUs, in this order (like `CUDA_VISIBLE_DEVICES`; empty = none). `set_visible_devices` then picks among what is left. As with CUDA, the list ends at its first invalid entry (`0,-1,1` keeps GPU 0), with a warning |
//! | `ANYGPU_FORCE_GPU_ALLOW_GROWTH` | `true`/`false` overrides `set_memory_growth` (like `TF_FORCE_GPU_ALLOW_GROWTH`) |
//! | `ANYGPU_GPU_MEMORY_LIMIT_MB` | budget of a whole physical GPU, instead of its reported memory less a reserve (2^64 bytes or more fails initialization) |
//! | `ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS` | `1`: software adapters (lavapipe, llvmpipe, WARP) count as GPUs for default and soft placement, as TensorFlow counts its GPUs (`RuntimeBuilder::software_adapters_as_gpus`); by default they run only what is placed on them by name |
//! | `ANYGPU_MEMORY_LOG` | `1`: log each arena region reserved or released |
//! | `ANYGPU_SMI` | `0`: do not publish this process's devices and memory for `anygpu-smi` (see [`smi`]) |
//! | `ANYGPU_SMI_DIR` | where processes publish for `anygpu-smi` (default `$XDG_RUNTIME_DIR/anygpu-smi`, else `<temp>/anygpu-smi-<uid>`) |
//! | `ANYGPU_REQUIRE_ADAPTER` | `1`: initialization fails when no GPU adapter is found (CI) |
//! | `ANYGPU_AUTOTUNE` | `on` (default): time an op's kernel variants on first use per adapter and shape class, keep the fastest (cached on disk); `full`: more runs and variants; `off`: heuristics |
//! | `ANYGPU_CACHE_DIR` | the autotuner's cache directory (default `$XDG_CACHE_HOME/anygpu`, else `~/.cache/anygpu`) |
//! | `ANYGPU_AUTOTUNE_FORCE` | one named kernel variant wherever an op has it, untimed (tests) |
//! | `ANYGPU_KERNEL_CLASS` | `software` or `gpu`: the adapter class the heuristics assume |
//!
//! ## Default placement
//!
//! Without a device scope an op runs on the default device — the first GPU on a hardware
//! adapter, else `CPU:0` — with its inputs copied there, as in TensorFlow. Software adapters
//! (lavapipe, llvmpipe, WARP: wgpu's `DeviceType::Cpu`) are listed and run anything you place
//! on them, but never become the default: on the same cores `CPU:0`'s native kernels are
//! faster. Name them (a device scope, [`LogicalDevice::scope`], `Tensor::from_slice_on`) to
//! use them; [`distribute::MirroredStrategy::new`] takes every logical GPU, software ones
//! included, as TF's `MirroredStrategy()` takes every GPU it lists. See
//! [`Runtime::default_device`]. `ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS=1` (or
//! [`RuntimeBuilder::software_adapters_as_gpus`]) counts them as GPUs, as TensorFlow counts
//! its GPUs: then TF's own default and soft-placement rules run on software adapters (CI).
//!
//! A GPU whose adapter fails to open or to reserve its budget at initialization is listed,
//! marked unavailable ([`LogicalDevice::unavailable_reason`]) and logged; ops placed there fail
//! with the reason, and every other device keeps working.
//!
//! ## Differences from TensorFlow
//!
//! * Without a scope, an op whose first input is on a GPU runs on that GPU (TensorFlow would
//!   copy it to the default device); inputs on a CPU go to the default device as in TF.
//! * Software adapters never become the default device (see above); TF does not see them.
//! * Device memory is known only where the backend reports it (Vulkan); elsewhere the budget is
//!   [`runtime::DEFAULT_GPU_MEMORY_LIMIT_MB`] unless `ANYGPU_GPU_MEMORY_LIMIT_MB` sets it.
#![deny(missing_docs)]
#![warn(rust_2018_idioms)]

mod atomic_file;
pub mod config;
pub mod data;
mod device;
pub mod distribute;
mod dtype;
mod error;
pub(crate) mod memory;
pub mod mixed_precision;
pub mod nn;
pub mod ops;
mod placement;
mod private_fs;
mod process;
pub mod profiler;
mod rng;
pub mod runtime;
mod shader;
mod shape;
pub mod smi;
mod tensor;

pub use device::{
    DeviceDetails, DeviceKind, DeviceSpec, GpuDetails, LogicalDevice, PhysicalDevice, StreamStats,
};
pub use error::{format_bytes, Error, Result};
pub use memory::{MemoryInfo, MemoryStats};
pub use placement::{current_device_spec, device, with_device, DeviceScope, IntoDeviceScope};
pub use runtime::{
    KindFilter, LogicalDeviceConfiguration, PlacementRecord, Runtime, RuntimeBuilder,
};
pub use shader::tune::{DecisionSource, TuningDecision};
pub use tensor::{DType, Element, Tensor};

// The Rust examples of the README and of docs/ run as doctests, so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

#[cfg(doctest)]
#[doc = include_str!("../docs/distributed.md")]
struct DistributedExamples;

#[cfg(doctest)]
#[doc = include_str!("../docs/mixed_precision.md")]
struct MixedPrecisionExamples;

#[cfg(doctest)]
#[doc = include_str!("../docs/models.md")]
struct ModelsExamples;
