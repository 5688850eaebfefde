package io.sparkguard.spark.common;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.SparkguardException.ConfigException;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The rules the operator's admission applies too come from the jar's shared rules file. */
class FirstWriteRulesTest {
  @Test
  void theSharedRulesRefuseWhatTheProtocolsRefuse() {
    assertTrue(FirstWriteRules.refuses("speculation", " TRUE "));
    assertFalse(FirstWriteRules.refuses("speculation", null));
    assertFalse(FirstWriteRules.refuses("speculation", "false"));
    assertTrue(FirstWriteRules.refuses("rerun-rewrite", "Rewrite"));
    assertFalse(FirstWriteRules.refuses("rerun-rewrite", null));
    assertTrue(FirstWriteRules.refuses("rerun-value", "always"));
    assertFalse(FirstWriteRules.refuses("rerun-value", "SKIP"));
    assertEquals(
        "s3a://b/t is written directly under its final names (object store), where a speculative"
            + " task copy that is killed publishes a file of partial rows over the winner's: set"
            + " spark.speculation=false for this job",
        FirstWriteRules.message("speculation", "s3a://b/t", "true"));
  }

  @Test
  void aBadRerunValueIsRefusedWithTheSharedMessage() {
    ConfigException e = assertThrows(ConfigException.class, () -> ProtocolSettings.parse(
        Map.of(ProtocolSettings.JOB_ID_KEY, "j", ProtocolSettings.RERUN_KEY, "Always")::get));
    assertEquals(FirstWriteRules.message("rerun-value", "", "always"), e.getMessage());
    assertTrue(e.getMessage().startsWith("spark.sparkguard.rerun 'always' is not valid"));
  }
}
