//! The steps run's account (`ledger_steps`), from the `E`, `W` and `M` lines its handlers write.

use std::collections::HashMap;

use super::STEPS;
use super::faults::Run;
use super::worker::step_effects;

/// The steps' account: every acked job ran each of its steps; a step ran again only where the
/// promise allows it: its worker was killed between its effect and its record (at most one step
/// of each message the victims held), its record failed to write (counted by the handler), or
/// the restart swept a live worker's claim past `min_idle`, which runs the rest of that message's
/// steps on two workers at once (at most every step of each message claimed at the restart).
///
/// That live worker may also write a step after the other one settled the message, which
/// recreates its record: `late` such records, each with its ttl (checked by the caller), at most
/// one for each message claimed at the restart.
pub(super) fn check_steps(
    run: &Run,
    acked: &HashMap<u32, u32>,
    [killed, restarted]: [usize; 2],
    late: usize,
) {
    let effects = step_effects(&run.ledgers);
    let incomplete: Vec<u32> = acked
        .keys()
        .filter(|n| (0..STEPS).any(|k| !effects.runs.contains_key(&(**n, k))))
        .copied()
        .collect();
    let again: u32 = effects.runs.values().map(|c| c - 1).sum();
    let allowed = killed + restarted * STEPS as usize + effects.unrecorded as usize;
    println!(
        "LEDGER steps: {} step runs, {again} again (allowed {allowed}: {killed} held at the kills, {restarted} at the restart, {} records that failed to write), {} acked jobs missing a step, {} replays of another step's result, {late} records written after their settle",
        effects.runs.values().sum::<u32>(),
        effects.unrecorded,
        incomplete.len(),
        effects.mixed_up
    );
    assert!(
        late <= restarted,
        "{late} step records written after their settle, more than the {restarted} messages claimed at the restart"
    );
    assert!(
        incomplete.is_empty(),
        "acked jobs missing a step's effect: {:?}",
        &incomplete[..incomplete.len().min(20)]
    );
    assert_eq!(effects.mixed_up, 0, "steps replayed another step's result");
    assert!(
        again as usize <= allowed,
        "{again} steps ran again, more than the {allowed} the kills, the restart and the failed records allow"
    );
}
