// aws-cdk-lib's built-in CloudFormation validator (its CloudFormationValidatePlugin) in a process of its own.
//
//     node worker.js ENGINE_DIR
//
// ENGINE_DIR holds the @aws/cloudformation-validate package aws-cdk-lib bundles (`cloudformation-validate/`) and
// aws-cdk-lib's default rules (`rules/*.rego`), both copied out of aws-cdk-lib's jsii bundle by
// `python -m cfn_validate` (cfn_validate/__init__.py says why). The engine starts as soon as this process does, on
// the other core, while the app builds its stacks, and checks a one-bucket template once: the first check of a
// process takes about 0.2 s longer than the next ones. Each line on stdin is a request
// ({"stackTemplates": [{stackConstructPath, templatePath, accountId, region}]}); each answer is one line on stdout:
// {"version": ..., "report": {success, violations}} or {"error": ...}. It ends when stdin closes (the app exited).
//
// validate() below is aws-cdk-lib 2.275.0's CloudFormationValidatePlugin.validate (core/lib/validation/
// cloudformation-validate-plugin.js) with the same options, ignored rules and mapping of diagnostics to violations;
// tests/test_cfn_validate.py compares the two plugins' reports on the same templates.
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");

const engineDir = process.argv[2];
const cfnValidate = require(path.join(engineDir, "cloudformation-validate"));

// aws-cdk-lib's IGNORE_RULES and its exclusion of W3697 for AWS::AutoScaling
const IGNORE_RULES = ["W3005", "W1020", "E1018", "W9002", "W9013", "W1103"];
const SEVERITY = { FATAL: "error", ERROR: "error", WARN: "warning", INFO: "informational", DEBUG: "debug" };

function defaultRegoRules() {
  const rulesDir = path.join(engineDir, "rules");
  return fs
    .readdirSync(rulesDir)
    .filter((f) => f.endsWith(".rego"))
    .sort()
    .map((f) => ({ name: f, content: fs.readFileSync(path.join(rulesDir, f), "utf-8") }));
}

const regoRules = defaultRegoRules();
const engine = new cfnValidate.CompositeEngine(regoRules.length > 0 ? { regoRules } : {});
const OPTIONS = {
  detailLevel: "STANDARD",
  exclude: { ids: IGNORE_RULES, services: [{ ruleId: "W3697", service: "AWS::AutoScaling" }] },
  severityLevel: "WARN",
};
engine.validateTemplate(
  new cfnValidate.TemplateContent(JSON.stringify({ Resources: { Bucket: { Type: "AWS::S3::Bucket" } } })),
  OPTIONS,
);

function validate(stackTemplates) {
  const violations = [];
  for (const { stackConstructPath, templatePath, accountId, region } of stackTemplates) {
    const report = engine.validateTemplate(new cfnValidate.TemplateFile(templatePath), {
      ...OPTIONS,
      pseudoParameterOverrides: { accountId: accountId ?? undefined, region: region ?? undefined },
    });
    for (const diagnostic of report.diagnostics) {
      const severity = SEVERITY[diagnostic.severity] || "warning";
      const resourceLogicalId =
        diagnostic.entity && diagnostic.entity.entityType === "Resource" ? diagnostic.entity.logicalId : undefined;
      const violatingResource = {
        resourceLogicalId,
        constructPath: resourceLogicalId ? undefined : stackConstructPath,
        templatePath,
        locations: diagnostic.propertyPath ? [diagnostic.propertyPath] : [],
      };
      const where = diagnostic.propertyPath ? `${diagnostic.propertyPath.replace(/^Properties\./, "")}: ` : "";
      const description = `${where}${diagnostic.message}`;
      const existing = violations.find(
        (v) => v.ruleName === diagnostic.ruleId && v.severity === severity && v.description === description,
      );
      if (existing) {
        existing.violatingResources.push(violatingResource);
      } else {
        violations.push({
          ruleName: diagnostic.ruleId,
          description,
          severity,
          fix: diagnostic.suggestedFix,
          violatingResources: [violatingResource],
          ruleMetadata: diagnostic.category ? { category: diagnostic.category } : undefined,
        });
      }
    }
  }
  return { success: violations.every((v) => v.severity !== "error" && v.severity !== "fatal"), violations };
}

const lines = readline.createInterface({ input: process.stdin });
lines.on("line", (line) => {
  let answer;
  try {
    answer = { version: cfnValidate.version(), report: validate(JSON.parse(line).stackTemplates) };
  } catch (error) {
    answer = { error: String((error && error.stack) || error) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
});
