//! `--strategy multi-worker`: the MPI strategy with feature `mpi`, and without it a stand-in
//! that says how to build it; the rank and the log prefix every worker needs before MPI starts.

use anygpu::LogicalDevice;

use crate::BoxError;

/// The logger (`RUST_LOG`, default `warn`), with `[worker k]` before the lines of workers
/// other than 0.
pub fn init_logger() {
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"));
    let rank = rank_from_env();
    if rank > 0 {
        use std::io::Write;
        logger.format(move |buf, record| {
            let (level, target) = (record.level(), record.target());
            writeln!(buf, "[worker {rank}] [{level} {target}] {}", record.args())
        });
    }
    logger.init();
}

/// Whether this process is worker 0, the chief, which alone prints the run and writes its
/// files (every process outside an MPI job is).
pub fn is_chief() -> bool {
    rank_from_env() == 0
}

/// This process's MPI rank as the launcher exported it (Open MPI, MPICH/PMI, Slurm), for
/// the log prefix before MPI starts; 0 outside a job.
pub fn rank_from_env() -> usize {
    env_index(&[
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "SLURM_PROCID",
    ])
}

/// This process's index among the workers on its machine (Horovod's `local_rank`).
pub fn local_rank() -> usize {
    env_index(&[
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ])
}

fn env_index(names: &[&str]) -> usize {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok()?.parse().ok())
        .unwrap_or(0)
}

/// `[worker k] ` on workers other than 0.
pub fn tag(rank: usize) -> String {
    match rank {
        0 => String::new(),
        k => format!("[worker {k}] "),
    }
}

#[cfg(feature = "mpi")]
pub use with_mpi::*;

#[cfg(feature = "mpi")]
mod with_mpi {
    use super::*;
    use anygpu::distribute::MultiWorkerMirroredStrategy;

    pub type Workers = MultiWorkerMirroredStrategy;

    /// Starts the strategy over `devices` and prints this worker's part.
    pub fn start(devices: &[LogicalDevice], global: usize) -> Result<Workers, BoxError> {
        let strategy = MultiWorkerMirroredStrategy::with_devices(devices)?;
        let k = strategy.worker_index();
        if k == 0 {
            println!(
                "MultiWorkerMirroredStrategy: {} workers, {} replicas in sync, global batch \
                 {global}",
                strategy.num_workers(),
                strategy.num_replicas_in_sync()
            );
        }
        let names: Vec<String> = strategy
            .local_devices()
            .iter()
            .map(|d| format!("{} ({})", d.name(), crate::devices::adapter(d)))
            .collect();
        println!(
            "{}worker {k}: devices {}, {} examples of each global batch of {global}",
            tag(k),
            names.join(", "),
            strategy.worker_batch_size(global)
        );
        Ok(strategy)
    }

    /// This build has MPI.
    pub fn require() -> Result<(), BoxError> {
        Ok(())
    }

    /// Exits with `result`'s error: an error only this worker has aborts every worker,
    /// one they agreed on (`Error::Distributed`) is every worker's and each exits by
    /// itself (the library's `exit_on_error`).
    pub fn exit_on_error(_rank: usize, result: Result<(), BoxError>) {
        MultiWorkerMirroredStrategy::exit_on_error(result)
    }

    pub fn rank(strategy: &Workers) -> usize {
        strategy.worker_index()
    }

    /// (whole reduction, MPI_Allreduce) in ms, summed over the steps so far.
    pub fn all_reduce_ms(strategy: &Workers) -> (f64, f64) {
        let t = strategy.all_reduce_times();
        (t.total.as_secs_f64() * 1e3, t.mpi.as_secs_f64() * 1e3)
    }
}

#[cfg(not(feature = "mpi"))]
pub use without_mpi::*;

#[cfg(not(feature = "mpi"))]
mod without_mpi {
    use super::*;

    /// No workers in a build without MPI: nothing of this type exists.
    pub enum Workers {}

    impl Workers {
        pub fn agree<T>(&self, _: &str, _: anygpu::Result<T>) -> anygpu::Result<T> {
            match *self {}
        }
        pub fn scope<R>(&self, _: impl FnOnce() -> R) -> anygpu::Result<R> {
            match *self {}
        }
    }

    pub fn rank(w: &Workers) -> usize {
        match *w {}
    }

    pub fn all_reduce_ms(w: &Workers) -> (f64, f64) {
        match *w {}
    }

    pub fn start(_: &[LogicalDevice], _: usize) -> Result<Workers, BoxError> {
        Err(require().err().unwrap_or_else(|| "no MPI".into()))
    }

    /// Says how to get a build with MPI.
    pub fn require() -> Result<(), BoxError> {
        Err(
            "--strategy multi-worker needs MPI: build with `cargo build --release \
             --features mpi --example fashion_mnist` (Open MPI and libclang installed), \
             then start it with `mpirun -n 2 target/release/examples/fashion_mnist \
             --strategy multi-worker`"
                .into(),
        )
    }

    pub fn exit_on_error(rank: usize, result: Result<(), BoxError>) {
        if let Err(e) = result {
            eprintln!("{}error: {e}", tag(rank));
            std::process::exit(1);
        }
    }
}
