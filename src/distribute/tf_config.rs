//! `TF_CONFIG`, the JSON that describes a TensorFlow cluster, checked against the job MPI
//! started: a multi-worker strategy accepts it only when it describes the same workers and
//! gives this process the rank MPI gave it. Outside feature `mpi` so that it is fuzzed and
//! tested in every build.

use crate::error::{Error, Result};

/// Checks `TF_CONFIG` against MPI's rank and size (public for the fuzz targets only).
///
/// # Errors
/// [`Error::InvalidArgument`] saying what does not match, with the text.
pub fn check_tf_config(text: &str, rank: usize, size: usize) -> Result<()> {
    let fail = Error::InvalidArgument;
    let config: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| fail(format!("TF_CONFIG is not JSON ({e}): {text}")))?;
    let count = |kind: &str| {
        config["cluster"][kind]
            .as_array()
            .map_or(0, |tasks| tasks.len())
    };
    let (chiefs, workers) = (count("chief"), count("worker"));
    if chiefs > 1 {
        return Err(fail(format!(
            "TF_CONFIG lists {chiefs} chiefs; a cluster has at most one: {text}"
        )));
    }
    let total = chiefs + workers;
    if total != size {
        return Err(fail(format!(
            "TF_CONFIG lists {total} workers but MPI started {size} processes: {text}"
        )));
    }
    let kind = config["task"]["type"].as_str().unwrap_or("");
    let index = config["task"]["index"]
        .as_u64()
        .and_then(|i| usize::try_from(i).ok())
        .ok_or_else(|| fail(format!("TF_CONFIG has no task index: {text}")))?;
    let (task, of_kind) = match kind {
        "chief" => (index, chiefs),
        "worker" => (chiefs + index, workers),
        other => {
            return Err(fail(format!(
                "TF_CONFIG task type {other:?} does not train; MultiWorkerMirroredStrategy \
                 takes \"chief\" and \"worker\" tasks"
            )))
        }
    };
    // An index past its list would alias another task's rank (chief 1 is worker 0's).
    if index >= of_kind {
        return Err(fail(format!(
            "TF_CONFIG task {kind}:{index} does not exist: the cluster lists {of_kind} \
             {kind} task(s): {text}"
        )));
    }
    if task != rank {
        return Err(fail(format!(
            "TF_CONFIG makes this process task {kind}:{index} (worker {task}), but MPI started \
             it as rank {rank}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tf_config_must_match_the_mpi_world() {
        let two =
            r#"{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}"#;
        assert!(check_tf_config(two, 1, 2).is_ok());
        let err = check_tf_config(two, 0, 2).unwrap_err().to_string();
        assert!(
            err.contains("task worker:1 (worker 1), but MPI started it as rank 0"),
            "{err}"
        );
        let err = check_tf_config(two, 0, 3).unwrap_err().to_string();
        assert!(err.contains("lists 2 workers but MPI started 3"), "{err}");
        let chief = r#"{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}"#;
        assert!(check_tf_config(chief, 1, 2).is_ok());
        assert!(check_tf_config("not json", 0, 1).is_err());
        // An index past its list, which would alias another task's rank.
        let past = r#"{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 1}}"#;
        let err = check_tf_config(past, 1, 2).unwrap_err().to_string();
        assert!(err.contains("task chief:1 does not exist"), "{err}");
        let past =
            r#"{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}"#;
        assert!(check_tf_config(past, 1, 2).is_err());
        let two_chiefs =
            r#"{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 1}}"#;
        let err = check_tf_config(two_chiefs, 1, 2).unwrap_err().to_string();
        assert!(err.contains("at most one"), "{err}");
        let ps = r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}"#;
        assert!(check_tf_config(ps, 0, 1)
            .unwrap_err()
            .to_string()
            .contains("does not train"));
    }
}
