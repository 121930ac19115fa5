//! The test kit of `qwen35`: the tiny-model fixtures ([`Fixture`]), the
//! accuracy gate against Hugging Face's goldens ([`gate`]) and its MoE form
//! ([`moe`]), the GPU gates' shared steps ([`gpu`]), a stand-in for the
//! engine's slot and page allocator ([`alloc`]), a driver of an engine
//! executor ([`drive`]) and the benchmark's count of the MLP weights a
//! token or a decode step reads ([`floor`]).
//!
//! A dev-dependency only (qwen35's tests and benchmark, gdn-server's GPU
//! test): no shipped binary links it.

pub mod alloc;
pub mod drive;
mod fixture;
pub mod floor;
pub mod gate;
pub mod gpu;
pub mod moe;

pub use fixture::{dir, Fixture, TopK, MODELS, MOE_MODELS};
